// The cross-kernel L2 prefetch of layer_ops.cu: the CTAs of a kernel each bring a share of the
// next GEMM's first weight bytes (kvlab.LLM's ahead_bytes), or of the K and V blocks the next
// attention reads (ahead_kv_bytes), into L2 over a warp's lanes, so that the next kernel starts on
// L2 hits. Built on prefetch.cuh's one-tile prefetch.
#pragma once

#include "prefetch.cuh"

namespace kvlab {

constexpr uint32_t PREFETCH_CHUNK_BYTES = 4096;  // one lane's bulk prefetch in prefetch_range_l2

// Prefetch bytes [begin, end) at `base` into L2, chunks of PREFETCH_CHUNK_BYTES spread over the
// `num_lanes` lanes of a warp (every lane calls it with its own `lane`). base 16-byte aligned,
// begin and end multiples of 16. sm_90: one bulk prefetch a chunk; before, a line at a time.
__device__ __forceinline__ void prefetch_range_l2(const void* base, uint64_t begin, uint64_t end,
                                                  int lane, int num_lanes) {
  const char* bytes = static_cast<const char*>(base);
  for (uint64_t off = begin + static_cast<uint64_t>(lane) * PREFETCH_CHUNK_BYTES; off < end;
       off += static_cast<uint64_t>(num_lanes) * PREFETCH_CHUNK_BYTES) {
    const uint32_t size = static_cast<uint32_t>(
        end - off < PREFETCH_CHUNK_BYTES ? end - off : PREFETCH_CHUNK_BYTES);
#if __CUDA_ARCH__ >= 900
    prefetch_tile_l2<PF_BULK, false>(bytes + off, size, 0, 1, 0);
#else
    prefetch_tile_l2<PF_LINE, false>(bytes + off, size, 0, 1, 0);
#endif
  }
}

// The share of CTA `cta` of `ctas` in the first `bytes` at `base` (bytes a multiple of 16): equal
// shares in 16-byte granules, the last ones shorter or empty; prefetched into L2 over the lanes
// of the calling warp (every lane calls it).
__device__ __forceinline__ void prefetch_share_l2(const void* base, long long bytes,
                                                  long long cta, long long ctas, int lane) {
  if (bytes <= 0 || cta < 0 || cta >= ctas) return;
  const long long share = (bytes / 16 + ctas - 1) / ctas * 16;
  const long long begin = cta * share, end = begin + share < bytes ? begin + share : bytes;
  if (begin < end) prefetch_range_l2(base, begin, end, lane, 32);
}

// A paged cache's blocks, as the attention after a kernel reads them: block j of row r is
// table[r * table_cols + j], for j < ceil(lens[r] / block_tokens); block b's K is the block_bytes
// at k + b * block_bytes (V's likewise at v). Ids outside [0, num_blocks) are never prefetched.
struct PagedBlocks {
  const char* k;
  const char* v;
  const int* table;
  const int* lens;
  int rows, table_cols, block_tokens, num_blocks;
  long long block_bytes;  // a multiple of 16
};

// The share of CTA `cta` of `ctas` in the first `pairs` (K block, V block) pairs of `blocks`,
// taken a block of every row in turn (pair t is block t / rows of row t % rows), so that a budget
// smaller than the rows' blocks brings each row's first ones, which the attention reads first.
// Prefetched into L2 over the lanes of the calling warp (every lane calls it).
__device__ __forceinline__ void prefetch_paged_share_l2(const PagedBlocks& blocks,
                                                        long long pairs, long long cta,
                                                        long long ctas, int lane) {
  if (pairs <= 0 || blocks.rows <= 0 || cta < 0 || cta >= ctas) return;
  const long long last = static_cast<long long>(blocks.rows) * blocks.table_cols;
  for (long long t = cta; t < pairs && t < last; t += ctas) {
    const int row = static_cast<int>(t % blocks.rows), j = static_cast<int>(t / blocks.rows);
    if (static_cast<long long>(j) * blocks.block_tokens >= blocks.lens[row]) continue;
    const int id = blocks.table[static_cast<long long>(row) * blocks.table_cols + j];
    if (id < 0 || id >= blocks.num_blocks) continue;
    const uint64_t at = static_cast<uint64_t>(id) * static_cast<uint64_t>(blocks.block_bytes);
    prefetch_range_l2(blocks.k + at, 0, blocks.block_bytes, lane, 32);
    prefetch_range_l2(blocks.v + at, 0, blocks.block_bytes, lane, 32);
  }
}

}  // namespace kvlab
