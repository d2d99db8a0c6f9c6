// A plain read of one contiguous buffer, each byte once: the bound a decode kernel's reading of
// the same bytes is measured against (`bench attention --kernels read`). Nothing is computed but
// the XOR of the 32-bit words read, one per CTA, which proves every word was read once.
// Settings probed and why these: docs/kernels/read_bytes.md.
// Current (494668b): 93.1% of the H200's copy roofline at 134 MB, the fastest setting probed
// there (a session probe at c12c8b9).
//
//   read_bytes: grid (num_ctas), block (READ_THREADS), no dynamic shared memory.
//     src   [num_words]  uint4 (16-byte words, 16-byte aligned).
//     sink  [num_ctas]   uint32: sink[c] = the XOR of the 32-bit words CTA c read; the XOR of all
//                        of sink is that of the whole buffer.
//   Each thread strides over the buffer by the grid's width with READ_UNROLL words in flight,
//   through the read-only path (`ld.global.nc`), 4 CTAs an SM (kvlab/kernels/read.py): the
//   fastest of the unroll, cache-hint and occupancy settings probed.

#include "timeline.cuh"

constexpr int READ_THREADS = 512;
constexpr int READ_UNROLL = 4;
constexpr int READ_WARPS = READ_THREADS / 32;

__device__ __forceinline__ unsigned int xor_words(const uint4 w) {
  return w.x ^ w.y ^ w.z ^ w.w;
}

extern "C" __global__ void __launch_bounds__(READ_THREADS)
    read_bytes(const uint4* __restrict__ src, long long num_words, unsigned int* sink) {
  namespace tl = kvlab::timeline::read;
  kvlab::timeline::start(tl::REGION, tl::ENTRY);
  const long long stride = static_cast<long long>(gridDim.x) * READ_THREADS;
  long long i = static_cast<long long>(blockIdx.x) * READ_THREADS + threadIdx.x;
  unsigned int acc = 0;
  for (; i + (READ_UNROLL - 1) * stride < num_words; i += READ_UNROLL * stride) {
    uint4 w[READ_UNROLL];
#pragma unroll
    for (int u = 0; u < READ_UNROLL; ++u) w[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < READ_UNROLL; ++u) acc ^= xor_words(w[u]);
  }
  for (; i < num_words; i += stride) acc ^= xor_words(__ldg(src + i));
  // the CTA's XOR: over each warp by shuffles, then over the warps by warp 0
  __shared__ unsigned int warp_acc[READ_WARPS];
  for (int offset = 16; offset > 0; offset /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x >= 32) return;
  acc = threadIdx.x < READ_WARPS ? warp_acc[threadIdx.x] : 0;
  for (int offset = 16; offset > 0; offset /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  if (threadIdx.x == 0) sink[blockIdx.x] = acc;
  kvlab::timeline::stamp(tl::REGION, tl::END);
}
