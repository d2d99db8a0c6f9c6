// Conversions between fp32 and the 16-bit element types (T: __half or __nv_bfloat16) that the
// kernel families share.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvlab {

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// f rounded to the nearest T.
template <typename T>
__device__ __forceinline__ T float_to(float f);

template <>
__device__ __forceinline__ __half float_to<__half>(float f) { return __float2half_rn(f); }

template <>
__device__ __forceinline__ __nv_bfloat16 float_to<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

}  // namespace kvlab
