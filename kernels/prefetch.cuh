// L2 prefetch of KV tiles, shared by the decode kernel families (arXiv 2504.06319, Algorithm 1).
//
// While a warp computes on KV block i it asks for block i + distance to be brought into L2, so that
// the later load hits L2 instead of waiting on HBM. Hopper (sm_90) only for the bulk form.
//
//   PF_NONE  no prefetch.
//   PF_BULK  cp.async.bulk.prefetch.L2.global: one instruction per contiguous tile, issued by one lane.
//            The address must be 16-byte aligned and the size a multiple of 16 bytes.
//   PF_LINE  prefetch.global.L2: one instruction per 128-byte line, spread over the lanes.
//
// EVICT_LAST marks the prefetched lines evict-last: for the bulk form through an L2 cache policy
// (createpolicy.fractional.L2::evict_last + .L2::cache_hint), for the line form through the
// prefetch.global.L2::evict_last variant.
#pragma once

// NVRTC has no <cstdint>; its built-in types are the same widths on every CUDA target.
#ifdef __CUDACC_RTC__
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <cstdint>
#endif

namespace kvlab {

enum : int { PF_NONE = 0, PF_BULK = 1, PF_LINE = 2 };

constexpr int L2_LINE_BYTES = 128;

// An L2 policy that keeps the lines it tags resident in preference to others.
__device__ __forceinline__ uint64_t make_evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// Prefetch `bytes` bytes at `ptr` into L2, cooperatively over the `num_lanes` lanes of a warp
// (every lane calls it with its own `lane`). `policy` is used only when EVICT_LAST.
template <int MODE, bool EVICT_LAST>
__device__ __forceinline__ void prefetch_tile_l2(const void* ptr, uint32_t bytes, int lane,
                                                 int num_lanes, uint64_t policy) {
  if constexpr (MODE == PF_BULK) {
    if (lane == 0) {
      if constexpr (EVICT_LAST) {
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;"
                     :: "l"(ptr), "r"(bytes), "l"(policy) : "memory");
      } else {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(ptr), "r"(bytes)
                     : "memory");
      }
    }
  } else if constexpr (MODE == PF_LINE) {
    const char* base = static_cast<const char*>(ptr);
    for (uint32_t off = lane * L2_LINE_BYTES; off < bytes; off += num_lanes * L2_LINE_BYTES) {
      if constexpr (EVICT_LAST) {
        asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(base + off) : "memory");
      } else {
        asm volatile("prefetch.global.L2 [%0];" :: "l"(base + off) : "memory");
      }
    }
  }
}

}  // namespace kvlab
