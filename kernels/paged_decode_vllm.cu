// Paged decode attention after the design of vLLM's PagedAttention v1/v2 kernel (the baseline of the
// L2-prefetch paper, arXiv 2504.06319), with the paper's L2 prefetch (Algorithm 1) as template options.
// Written from the design, not from vLLM's source.
// Design notes, versions and dead ends: docs/kernels/vllm_v1.md.
// Current (554f766): 0.963-1.046x the speed of vLLM's own kernels at their 20 points, recorded
// at 15947c5 (benchmarks/results/h200/attention_vllm.json).
//
// One decode step: every query head of every sequence attends to all of that sequence's cached tokens.
//
// Inputs and outputs (T = __half or __nv_bfloat16, x = 16 / sizeof(T) = 8 elements = 16 bytes):
//   q             [num_seqs, num_qo_heads, HEAD_DIM]                                  T, contiguous
//   k_cache       [num_blocks, num_kv_heads, HEAD_DIM / x, BLOCK_SIZE, x]             T, contiguous
//   v_cache       [num_blocks, num_kv_heads, HEAD_DIM, BLOCK_SIZE]                    T, contiguous
//   block_tables  [num_seqs, max_num_blocks_per_seq]  int32 block ids (padding never read)
//   seq_lens      [num_seqs]                          int32, each >= 1
//   out           [num_seqs, num_qo_heads, HEAD_DIM]                                  T
//   partial_out   [num_seqs, num_qo_heads, max_num_partitions, HEAD_DIM]              fp32 (v2)
//   partial_max   [num_seqs, num_qo_heads, max_num_partitions]                        fp32 (v2)
//   partial_sum   [num_seqs, num_qo_heads, max_num_partitions]                        fp32 (v2)
// Query head h reads KV head h / (num_qo_heads / num_kv_heads); num_qo_heads = gridDim.x.
// One (block, KV head) tile of K or V is HEAD_DIM * BLOCK_SIZE contiguous elements starting at
// cache + (block_id * num_kv_heads + kv_head) * HEAD_DIM * BLOCK_SIZE.
//
// Variants (template parameters of vllm_decode):
//   The launcher chooses as vLLM does: v1 when max_seq_len <= 8192 and either one 512-token
//   partition covers it or num_seqs * num_qo_heads > 512; v2 otherwise.
//   PARTITION_SIZE == 0 (v1): grid (num_qo_heads, num_seqs, 1). One CTA of 4 warps per (query head,
//     sequence) covers the whole sequence and writes `out`.
//   PARTITION_SIZE  > 0 (v2, 512 in kvlab): grid (num_qo_heads, num_seqs, max_num_partitions). CTA p
//     covers tokens [p * PARTITION_SIZE, min((p + 1) * PARTITION_SIZE, seq_len)) and returns at once
//     if that range is empty. It writes partial_max = the partition's max logit m_p, partial_sum =
//     s_p = sum of exp(logit - m_p), and partial_out = the partition's own softmax-weighted average
//     of V (already divided by s_p). vllm_reduce then merges the ceil(seq_len / PARTITION_SIZE)
//     partitions of each (sequence, query head): out = sum_p partial_out_p * s_p * exp(m_p - M) /
//     sum_p s_p * exp(m_p - M), M = max_p m_p.
//   PF_MODE (kvlab::PF_NONE / PF_BULK / PF_LINE, see prefetch.cuh), PF_K, PF_V, PF_DIST,
//     PF_EVICT_LAST: in the K loop (PF_K) and in the V loop (PF_V), right after a warp has issued
//     the (first batch of) loads of its current block i, it prefetches into L2 the tile of block
//     i + PF_DIST * 4 (PF_DIST of its own strides ahead) when that block is still inside the
//     CTA's range. With
//     PF_EVICT_LAST the prefetched lines are tagged evict-last (bulk: through one L2 policy made per
//     thread at the start; line: the evict_last form of the prefetch). PF_NONE compiles to the same
//     SASS as the baseline whatever the other PF_* values are.
//
// Work split inside a CTA (128 threads = 4 warps), as in vLLM:
//   q:    staged in shared memory by the CTA (one barrier) and read back for every block.
//   q.k:  warp w takes blocks w, w + 4, w + 8, ... of its range. In a warp, one "thread group" of
//         THREAD_GROUP_SIZE = 32 / BLOCK_SIZE lanes (4, 2, 1 for block size 8, 16, 32) computes the
//         logit of one token, so a warp covers one block per iteration. The group reads each 16-byte
//         x-vector of its token's K together (each lane x / THREAD_GROUP_SIZE elements, i.e. 4, 8 or
//         16 bytes), against the matching slice of q read from shared memory (fp32 products and
//         sums), then sums over the group with shuffles. Logits (fp32, scaled) go to shared memory.
//   softmax: two passes over the logits in shared memory: block max, then __expf and block sum;
//         the weights are the logits times __fdividef(1, sum + 1e-6), vLLM's normalisation.
//   p.V:  the same warp-to-block split. A V tile row (one dim, BLOCK_SIZE tokens) is read as
//         BLOCK_SIZE / 8 16-byte vectors by as many lanes; a warp covers 32 / (BLOCK_SIZE / 8) rows
//         per step and loops over HEAD_DIM. The 8 weights of a vector are rounded to T and a
//         row's 8 products summed in T (fused multiply-adds on packed pairs), the pair's sum then
//         in fp32 into the lane's row accumulator; the lanes of a row are summed with shuffles,
//         the 4 warps through shared memory (a 2-level tree).
//   Tokens at or past seq_len in the sequence's last block get weight 0 and their V values are
//   replaced by 0 before the multiply (the unused slots of a block may hold NaN/Inf).
//
// Shared memory:
//   vllm_decode  dynamic bytes = 4 * max(NUM_LOGITS, (NUM_WARPS / 2) * HEAD_DIM), NUM_WARPS = 4, i.e.
//                4 * max(NUM_LOGITS, 2 * HEAD_DIM), where NUM_LOGITS = PARTITION_SIZE for v2 and
//                round_up(max_seq_len, BLOCK_SIZE) for v1 (max over the batch). The logits use the
//                first region; after the p.V loop the same bytes hold the cross-warp output sums.
//                Static: 2 * NUM_WARPS floats and q (32 B + 2 * HEAD_DIM B). Above 48 KiB the
//                launcher must raise the kernel's max dynamic shared memory (227 KiB on H100/H200, i.e. v1 up to ~58k tokens).
//   vllm_reduce  no dynamic shared memory; static NUM_THREADS + 2 * NUM_WARPS floats (544 B). Any
//                number of partitions (weights are staged 128 partitions at a time).
//
// Where it follows vLLM's build rather than its source (vLLM 0.9.2 compiled by nvcc 13 for
// sm_90, read from the SASS; kvlab.kernels.vllm_own times those kernels beside this one): the
// K loop issues a block's x-vectors in KLoadBatches' round trips; the p.V sums a row's 8
// products in T and tests for the last block row by row; the launch bounds ask for vLLM's
// 5 CTAs an SM where that costs no spills.

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "dtypes.cuh"
#include "prefetch.cuh"

namespace kvlab {
namespace vllm {

constexpr int WARP_SIZE = 32;
constexpr int NUM_WARPS = 4;
constexpr int NUM_THREADS = NUM_WARPS * WARP_SIZE;
constexpr unsigned FULL_MASK = 0xffffffffu;

// Dynamic shared memory of vllm_decode, in bytes (the Python launcher computes the same).
__host__ __device__ constexpr int decode_smem_bytes(int head_dim, int block_size,
                                                    int partition_size, int max_seq_len) {
  const int num_logits =
      partition_size > 0 ? partition_size : (max_seq_len + block_size - 1) / block_size * block_size;
  const int num_out = (NUM_WARPS / 2) * head_dim;
  return 4 * (num_logits > num_out ? num_logits : num_out);
}

__device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }
__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ float neg_inf() { return __uint_as_float(0xff800000u); }

// ---- 16-bit element pairs packed in 32-bit words --------------------------------------------

// The two elements of a 32-bit word (low half first, i.e. in memory order) as floats.
template <typename T>
__device__ __forceinline__ float2 word_to_float2(uint32_t w);

template <>
__device__ __forceinline__ float2 word_to_float2<__half>(uint32_t w) {
  return __half22float2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)),
                                       __ushort_as_half(static_cast<unsigned short>(w >> 16))));
}

template <>
__device__ __forceinline__ float2 word_to_float2<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// Two floats rounded to T and packed (the low half first).
template <typename T>
__device__ __forceinline__ uint32_t float2_to_word(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t float2_to_word<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t float2_to_word<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// a * b + c pairwise on packed words, in T (one rounding: the fused multiply-add).
template <typename T>
__device__ __forceinline__ uint32_t fma_words(uint32_t a, uint32_t b, uint32_t c);

template <>
__device__ __forceinline__ uint32_t fma_words<__half>(uint32_t a, uint32_t b, uint32_t c) {
  const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&a),
                            *reinterpret_cast<const __half2*>(&b),
                            *reinterpret_cast<const __half2*>(&c));
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <>
__device__ __forceinline__ uint32_t fma_words<__nv_bfloat16>(uint32_t a, uint32_t b, uint32_t c) {
  const __nv_bfloat162 r = __hfma2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b),
                                   *reinterpret_cast<const __nv_bfloat162*>(&c));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// One vector load of N words (4, 8 or 16 bytes; `p` aligned to that size).
template <int N>
__device__ __forceinline__ void load_words(uint32_t (&w)[N], const void* p) {
  static_assert(N == 1 || N == 2 || N == 4, "loads of 4, 8 or 16 bytes");
  if constexpr (N == 1) {
    w[0] = *static_cast<const uint32_t*>(p);
  } else if constexpr (N == 2) {
    const uint2 v = *static_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    const uint4 v = *static_cast<const uint4*>(p);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
}

// ---- reductions ------------------------------------------------------------------------------

template <bool IS_MAX>
__device__ __forceinline__ float combine(float a, float b) { return IS_MAX ? fmaxf(a, b) : a + b; }

// Butterfly over the lane masks FIRST_MASK, FIRST_MASK / 2, ..., LAST_MASK: every lane gets the result
// over the lanes that differ from it only in those bits.
template <bool IS_MAX, int FIRST_MASK, int LAST_MASK>
__device__ __forceinline__ float warp_reduce(float x) {
#pragma unroll
  for (int mask = FIRST_MASK; mask >= LAST_MASK; mask /= 2) {
    x = combine<IS_MAX>(x, __shfl_xor_sync(FULL_MASK, x, mask));
  }
  return x;
}

// Max or sum over the CTA, returned to every thread. `red` is NUM_WARPS floats of shared memory,
// used once. LAST_MASK > 1 skips the shuffles over lanes known to hold equal values.
template <bool IS_MAX, int LAST_MASK = 1>
__device__ __forceinline__ float block_reduce(float x, float* red) {
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  x = warp_reduce<IS_MAX, WARP_SIZE / 2, LAST_MASK>(x);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = lane < NUM_WARPS ? red[lane] : (IS_MAX ? neg_inf() : 0.f);
  x = warp_reduce<IS_MAX, NUM_WARPS / 2, 1>(x);
  return __shfl_sync(FULL_MASK, x, 0);
}

// ---- geometry --------------------------------------------------------------------------------

template <typename T, int HEAD_DIM, int BLOCK_SIZE>
struct Geometry {
  static_assert(sizeof(T) == 2, "T is a 16-bit type");
  static_assert(BLOCK_SIZE == 8 || BLOCK_SIZE == 16 || BLOCK_SIZE == 32, "block size 8, 16 or 32");
  static_assert(HEAD_DIM >= 64 && HEAD_DIM <= 256, "head_dim in [64, 256]");

  static constexpr int X = 16 / sizeof(T);                 // elements of one 16-byte x-vector
  static constexpr int TILE_ELEMS = HEAD_DIM * BLOCK_SIZE;  // one (block, KV head) tile of K or V
  static constexpr int TILE_BYTES = TILE_ELEMS * sizeof(T);

  // q.k: one thread group per token, one block per warp.
  static constexpr int THREAD_GROUP_SIZE = WARP_SIZE / BLOCK_SIZE;
  static constexpr int NUM_X_VECS = HEAD_DIM / X;            // x-vectors per token
  static constexpr int K_VEC = X / THREAD_GROUP_SIZE;        // elements per lane per x-vector
  static constexpr int K_WORDS = K_VEC / 2;

  // p.V: V_VECS_PER_ROW lanes per row of a V tile, ROWS_PER_STEP rows per warp step.
  static constexpr int V_VEC = X;
  static constexpr int V_WORDS = V_VEC / 2;
  static_assert(V_WORDS == 4, "p.V reads 8-element vectors");
  static constexpr int V_VECS_PER_ROW = BLOCK_SIZE / V_VEC;
  static constexpr int ROWS_PER_STEP = WARP_SIZE / V_VECS_PER_ROW;
  static constexpr int ROWS_PER_LANE = (HEAD_DIM + ROWS_PER_STEP - 1) / ROWS_PER_STEP;

  static_assert(THREAD_GROUP_SIZE * BLOCK_SIZE == WARP_SIZE, "a warp covers one block");
  static_assert(HEAD_DIM % X == 0, "whole x-vectors");
};

// How many memory round trips one block's K takes, and which x-vectors each issues, as nvcc 13
// schedules vLLM's source for sm_90 (the header; read from the SASS at head_dim 128, block 16,
// fp16, which bf16 follows): v1 issues 7 x-vectors, then the other 9 once the first products are
// in; v2 issues 2, then 1, then 13. Other shapes were not read: two equal batches.
template <int NUM_X_VECS, int BLOCK_SIZE, bool V2>
struct KLoadBatches {
  static constexpr bool READ = NUM_X_VECS == 16 && BLOCK_SIZE == 16;
  static constexpr int COUNT = READ && V2 ? 3 : 2;
  // x-vectors issued before batch b ends (end(COUNT - 1) == NUM_X_VECS)
  __device__ static constexpr int end(int b) {
    if constexpr (!READ) return (b + 1) * NUM_X_VECS / 2;
    if constexpr (V2) return b == 0 ? 2 : b == 1 ? 3 : NUM_X_VECS;
    return b == 0 ? 7 : NUM_X_VECS;
  }
};

// First element of the (block_id, kv_head) tile of a K or V cache.
template <int TILE_ELEMS, typename T>
__device__ __forceinline__ const T* kv_tile(const T* cache, int block_id, int num_kv_heads,
                                            int kv_head) {
  return cache + (static_cast<int64_t>(block_id) * num_kv_heads + kv_head) * TILE_ELEMS;
}

// The CTA's blocks [start_block, end_block) and tokens [start_token, start_token + num_tokens).
struct Range {
  int start_block, end_block, num_seq_blocks;
  int start_token, num_tokens;
};

// Algorithm 1 of arXiv 2504.06319: from the whole warp, ask for the tile of the block PF_DIST warp
// strides ahead of `block_idx` to be brought into L2, if that block is in the CTA's range.
template <int PF_MODE, bool PF_EVICT_LAST, int PF_DIST, int TILE_ELEMS, typename T>
__device__ __forceinline__ void prefetch_ahead(const T* cache, const int* block_table, int block_idx,
                                               int end_block, int num_kv_heads, int kv_head,
                                               int lane, uint64_t policy) {
  const int ahead = block_idx + PF_DIST * NUM_WARPS;
  if (ahead < end_block) {
    const T* tile = kv_tile<TILE_ELEMS>(cache, block_table[ahead], num_kv_heads, kv_head);
    prefetch_tile_l2<PF_MODE, PF_EVICT_LAST>(tile, TILE_ELEMS * sizeof(T), lane, WARP_SIZE, policy);
  }
}

// ---- phase 1: logits = scale * q.k -----------------------------------------------------------

// Writes logits[0, (end_block - start_block) * BLOCK_SIZE) (0 for tokens >= seq_len) and returns
// this thread's max over the valid logits it saw (-inf if none). q_smem holds the head's q (the
// CTA staged it); as in vLLM, each thread group reads its slice of q from shared memory for
// every block instead of keeping it in registers (which leaves registers for a fifth CTA an SM).
template <typename T, int HEAD_DIM, int BLOCK_SIZE, bool V2, int PF_MODE, bool PF_K, int PF_DIST,
          bool PF_EVICT_LAST>
__device__ __forceinline__ float qk_logits(float* logits, const T* q_smem, const T* k_cache,
                                           const int* block_table, const Range& r, int seq_len,
                                           int num_kv_heads, int kv_head, float scale,
                                           uint64_t policy) {
  using G = Geometry<T, HEAD_DIM, BLOCK_SIZE>;
  const int thread_idx = threadIdx.x;
  const int warp = thread_idx / WARP_SIZE, lane = thread_idx % WARP_SIZE;
  const int token_in_block = lane / G::THREAD_GROUP_SIZE;  // this lane's thread group
  const int group_lane = thread_idx % G::THREAD_GROUP_SIZE;  // its slice of each x-vector
  // q slice: elements [c * X + group_lane * K_VEC, + K_VEC) for c < NUM_X_VECS.
  const T* q_lane = q_smem + group_lane * G::K_VEC;

  float qk_max = neg_inf();
  for (int block_idx = r.start_block + warp; block_idx < r.end_block; block_idx += NUM_WARPS) {
    // K tile [HEAD_DIM / X, BLOCK_SIZE, X]: this lane reads [c, token_in_block, group_lane * K_VEC:].
    const T* k_tile =
        kv_tile<G::TILE_ELEMS>(k_cache, block_table[block_idx], num_kv_heads, kv_head);
    const T* k_row = k_tile + token_in_block * G::X;
    // One fp32 chain per element pair, then the group's lanes summed. The block's K vectors are
    // loaded in the batches of KLoadBatches, as vLLM's build issues them (see the header): batch
    // b + 1 is addressed through `dep`, which is 0 but known only once batch b's products are
    // in, so its loads wait for batch b (nvcc 13's SASS keeps that order; this source's own
    // build would issue all 16 at once, one round trip).
    using Batches = KLoadBatches<G::NUM_X_VECS, BLOCK_SIZE, V2>;
    float2 acc[G::K_WORDS];
#pragma unroll
    for (int w = 0; w < G::K_WORDS; ++w) acc[w] = make_float2(0.f, 0.f);
    int dep = 0;
#pragma unroll
    for (int b = 0; b < Batches::COUNT; ++b) {
      const int first = b == 0 ? 0 : Batches::end(b - 1), last = Batches::end(b);
      // j runs over every x-vector and skips those of other batches: a constant trip count
      // unrolls whole, so k_words stays in registers (nvcc 13 leaves a loop from `first` to
      // `last` partly rolled at blocks 8 and 32 and at head_dim 256, k_words in local memory)
      uint32_t k_words[G::NUM_X_VECS][G::K_WORDS];
#pragma unroll
      for (int j = 0; j < G::NUM_X_VECS; ++j) {
        if (j < first || j >= last) continue;
        const int vec_idx = group_lane + j * G::THREAD_GROUP_SIZE;
        const int offset1 = vec_idx * G::K_VEC / G::X, offset2 = vec_idx * G::K_VEC % G::X;
        load_words(k_words[j], k_row + (dep + offset1 * BLOCK_SIZE * G::X + offset2));
      }
      if constexpr (PF_MODE != PF_NONE && PF_K) {
        if (b == 0) {
          prefetch_ahead<PF_MODE, PF_EVICT_LAST, PF_DIST, G::TILE_ELEMS>(
              k_cache, block_table, block_idx, r.end_block, num_kv_heads, kv_head, lane, policy);
        }
      }
#pragma unroll
      for (int j = 0; j < G::NUM_X_VECS; ++j) {
        if (j < first || j >= last) continue;
        uint32_t q_words[G::K_WORDS];
        load_words(q_words, q_lane + j * G::X);
#pragma unroll
        for (int w = 0; w < G::K_WORDS; ++w) {
          const float2 qf = word_to_float2<T>(q_words[w]);
          const float2 kf = word_to_float2<T>(k_words[j][w]);
          acc[w].x = fmaf(qf.x, kf.x, acc[w].x);
          acc[w].y = fmaf(qf.y, kf.y, acc[w].y);
        }
      }
      // x * 0 is 0, -0 or NaN, each converted to 0 (cvt.rzi); a compiler may fold it to 0,
      // which would drop the second round trip (the sums stay the same), and ours do not
      if (b + 1 < Batches::COUNT) dep = __float2int_rz(acc[0].x * 0.f);
    }
    float qk = 0.f;
#pragma unroll
    for (int w = 0; w < G::K_WORDS; ++w) qk += acc[w].x + acc[w].y;
    if constexpr (G::THREAD_GROUP_SIZE > 1) {
      qk = warp_reduce<false, G::THREAD_GROUP_SIZE / 2, 1>(qk);
    }
    qk *= scale;

    const int token = block_idx * BLOCK_SIZE + token_in_block;
    const bool valid = token < seq_len;
    if (group_lane == 0) logits[token - r.start_token] = valid ? qk : 0.f;
    if (valid) qk_max = fmaxf(qk_max, qk);
  }
  return qk_max;
}

// ---- phase 2: softmax over the logits in shared memory ---------------------------------------

// Turns logits[0, num_padded) into softmax weights in place (0 past num_tokens); returns
// (max logit, sum of exp(logit - max)) to every thread. Ends with a barrier.
template <int THREAD_GROUP_SIZE>
__device__ __forceinline__ float2 softmax_in_place(float* logits, float qk_max, int num_tokens,
                                                   int num_padded, float* red) {
  // The lanes of a thread group saw the same logits: skip their shuffles.
  qk_max = block_reduce<true, THREAD_GROUP_SIZE>(qk_max, red);

  float exp_sum = 0.f;
  for (int i = threadIdx.x; i < num_padded; i += NUM_THREADS) {
    const float e = i < num_tokens ? __expf(logits[i] - qk_max) : 0.f;
    logits[i] = e;
    exp_sum += e;
  }
  exp_sum = block_reduce<false>(exp_sum, red + NUM_WARPS);

  // exp_sum >= 1 (the max logit contributes exp(0)); the fast divide and the 1e-6 are vLLM's
  const float inv_sum = __fdividef(1.f, exp_sum + 1e-6f);
  for (int i = threadIdx.x; i < num_padded; i += NUM_THREADS) logits[i] *= inv_sum;
  __syncthreads();
  return make_float2(qk_max, exp_sum);
}

// ---- phase 3: out = weights . V ---------------------------------------------------------------

// Accumulates this lane's rows (dims lane / V_VECS_PER_ROW + i * ROWS_PER_STEP) over the warp's
// blocks, summed over the lanes of each row: every lane of a row ends with the warp's total.
template <typename T, int HEAD_DIM, int BLOCK_SIZE, int PF_MODE, bool PF_V, int PF_DIST,
          bool PF_EVICT_LAST>
__device__ __forceinline__ void weights_times_v(
    float (&acc)[Geometry<T, HEAD_DIM, BLOCK_SIZE>::ROWS_PER_LANE], const float* weights,
    const T* v_cache, const int* block_table, const Range& r, int seq_len, int num_kv_heads,
    int kv_head, uint64_t policy) {
  using G = Geometry<T, HEAD_DIM, BLOCK_SIZE>;
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int vec_in_row = lane % G::V_VECS_PER_ROW;  // tokens [vec_in_row * V_VEC, + V_VEC)
  const int row0 = lane / G::V_VECS_PER_ROW;

#pragma unroll
  for (int i = 0; i < G::ROWS_PER_LANE; ++i) acc[i] = 0.f;

  for (int block_idx = r.start_block + warp; block_idx < r.end_block; block_idx += NUM_WARPS) {
    const int token0 = block_idx * BLOCK_SIZE + vec_in_row * G::V_VEC;
    // V tile [HEAD_DIM, BLOCK_SIZE]: this lane reads [row0 + i * ROWS_PER_STEP, token0 - block start:].
    const T* v_tile =
        kv_tile<G::TILE_ELEMS>(v_cache, block_table[block_idx], num_kv_heads, kv_head);
    const T* v_lane = v_tile + row0 * BLOCK_SIZE + vec_in_row * G::V_VEC;
    uint32_t v_words[G::ROWS_PER_LANE][G::V_WORDS];
#pragma unroll
    for (int i = 0; i < G::ROWS_PER_LANE; ++i) {
      if (row0 + i * G::ROWS_PER_STEP < HEAD_DIM) {
        load_words(v_words[i], v_lane + i * G::ROWS_PER_STEP * BLOCK_SIZE);
      }
    }
    if constexpr (PF_MODE != PF_NONE && PF_V) {
      prefetch_ahead<PF_MODE, PF_EVICT_LAST, PF_DIST, G::TILE_ELEMS>(
          v_cache, block_table, block_idx, r.end_block, num_kv_heads, kv_head, lane, policy);
    }

    // Weights of tokens token0 .. token0 + 7 (32-byte aligned in shared memory), rounded to T
    // as vLLM does: a row's 8 products are summed in T (pairs of a packed word, fused
    // multiply-adds), and that pair's sum in fp32 is added to the row's fp32 accumulator.
    const float4* w4 = reinterpret_cast<const float4*>(weights + (token0 - r.start_token));
    const float4 wa = w4[0], wb = w4[1];
    const uint32_t w[G::V_WORDS] = {float2_to_word<T>(wa.x, wa.y), float2_to_word<T>(wa.z, wa.w),
                                    float2_to_word<T>(wb.x, wb.y), float2_to_word<T>(wb.z, wb.w)};
#pragma unroll
    for (int i = 0; i < G::ROWS_PER_LANE; ++i) {
      if (row0 + i * G::ROWS_PER_STEP < HEAD_DIM) {
        // NOTE: only the sequence's last block has slots past seq_len; their V may be NaN/Inf,
        // so there their values are zeroed, not just multiplied by a 0 weight. The test is made
        // for each row, as in vLLM's source, whose build branches around it row by row.
        if (block_idx == r.num_seq_blocks - 1) {
#pragma unroll
          for (int j = 0; j < G::V_WORDS; ++j) {
            v_words[i][j] &= (token0 + 2 * j < seq_len ? 0x0000ffffu : 0u) |
                             (token0 + 2 * j + 1 < seq_len ? 0xffff0000u : 0u);
          }
        }
        uint32_t sum = fma_words<T>(w[0], v_words[i][0], 0u);
#pragma unroll
        for (int j = 1; j < G::V_WORDS; ++j) sum = fma_words<T>(w[j], v_words[i][j], sum);
        const float2 f = word_to_float2<T>(sum);
        acc[i] += f.x + f.y;
      }
    }
  }

  if constexpr (G::V_VECS_PER_ROW > 1) {
#pragma unroll
    for (int i = 0; i < G::ROWS_PER_LANE; ++i) {
      acc[i] = warp_reduce<false, G::V_VECS_PER_ROW / 2, 1>(acc[i]);
    }
  }
}

// Sums acc over the 4 warps (a tree through `out_smem`, [NUM_WARPS / 2, HEAD_DIM] floats): warp 0's
// lanes with vec_in_row == 0 end with the totals of their rows.
template <int HEAD_DIM, int V_VECS_PER_ROW, int ROWS_PER_STEP, int ROWS_PER_LANE>
__device__ __forceinline__ void sum_over_warps(float (&acc)[ROWS_PER_LANE], float* out_smem) {
  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const bool row_owner = lane % V_VECS_PER_ROW == 0;
  const int row0 = lane / V_VECS_PER_ROW;
#pragma unroll
  for (int active = NUM_WARPS; active > 1; active /= 2) {
    const int mid = active / 2;
    if (warp >= mid && warp < active && row_owner) {
#pragma unroll
      for (int i = 0; i < ROWS_PER_LANE; ++i) {
        const int row = row0 + i * ROWS_PER_STEP;
        if (row < HEAD_DIM) out_smem[(warp - mid) * HEAD_DIM + row] = acc[i];
      }
    }
    __syncthreads();
    if (warp < mid && row_owner) {
#pragma unroll
      for (int i = 0; i < ROWS_PER_LANE; ++i) {
        const int row = row0 + i * ROWS_PER_STEP;
        if (row < HEAD_DIM) acc[i] += out_smem[warp * HEAD_DIM + row];
      }
    }
    __syncthreads();
  }
}

// ---- the decode CTA ---------------------------------------------------------------------------

template <typename T, int HEAD_DIM, int BLOCK_SIZE, int PARTITION_SIZE, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST>
__device__ __forceinline__ void decode_cta(T* out, float* partial_out, float* partial_max,
                                           float* partial_sum, const T* q, const T* k_cache,
                                           const T* v_cache, const int* block_tables,
                                           const int* seq_lens, int max_num_blocks_per_seq,
                                           int num_kv_heads, int max_num_partitions, float scale,
                                           float* smem, float* red, uint4* q_smem) {
  using G = Geometry<T, HEAD_DIM, BLOCK_SIZE>;
  static_assert(PARTITION_SIZE >= 0 && PARTITION_SIZE % BLOCK_SIZE == 0, "whole blocks per partition");
  static_assert(PF_MODE == PF_NONE || PF_MODE == PF_BULK || PF_MODE == PF_LINE, "PF_MODE");
  static_assert(PF_MODE == PF_NONE || PF_DIST >= 1, "PF_DIST >= 1");
  static_assert(PF_MODE != PF_BULK || G::TILE_BYTES % 16 == 0, "bulk prefetch: multiple of 16 B");

  const int head = blockIdx.x, seq = blockIdx.y, partition = blockIdx.z;
  const int num_qo_heads = gridDim.x;
  const int kv_head = head / (num_qo_heads / num_kv_heads);
  const int seq_len = seq_lens[seq];

  Range r;
  r.num_seq_blocks = ceil_div(seq_len, BLOCK_SIZE);
  r.start_block = 0;
  r.end_block = r.num_seq_blocks;
  if constexpr (PARTITION_SIZE > 0) {
    constexpr int BLOCKS_PER_PARTITION = PARTITION_SIZE / BLOCK_SIZE;
    r.start_block = partition * BLOCKS_PER_PARTITION;
    if (r.start_block >= r.num_seq_blocks) return;  // partition starts at or past seq_len
    r.end_block = imin(r.start_block + BLOCKS_PER_PARTITION, r.num_seq_blocks);
  }
  r.start_token = r.start_block * BLOCK_SIZE;
  r.num_tokens = imin(r.end_block * BLOCK_SIZE, seq_len) - r.start_token;
  const int num_padded = (r.end_block - r.start_block) * BLOCK_SIZE;

  // The bulk form takes an L2 policy; the line form has its own evict_last variant.
  uint64_t policy = 0;
  if constexpr (PF_MODE == PF_BULK && PF_EVICT_LAST) policy = make_evict_last_policy();

  // NOTE: entries past the sequence's last block are padding: only [start_block, end_block) is read.
  const int* block_table = block_tables + static_cast<int64_t>(seq) * max_num_blocks_per_seq;
  const int64_t head_row = static_cast<int64_t>(seq) * num_qo_heads + head;  // [seq, head]
  float* logits = smem;                                                       // [num_padded]

  // q of the head, staged in shared memory as 16-byte vectors
  for (int i = threadIdx.x; i < G::NUM_X_VECS; i += NUM_THREADS) {
    q_smem[i] = reinterpret_cast<const uint4*>(q + head_row * HEAD_DIM)[i];
  }
  __syncthreads();
  const float qk_max = qk_logits<T, HEAD_DIM, BLOCK_SIZE, (PARTITION_SIZE > 0), PF_MODE, PF_K,
                                 PF_DIST, PF_EVICT_LAST>(
      logits, reinterpret_cast<const T*>(q_smem), k_cache, block_table, r, seq_len, num_kv_heads,
      kv_head, scale, policy);
  const float2 max_sum =
      softmax_in_place<G::THREAD_GROUP_SIZE>(logits, qk_max, r.num_tokens, num_padded, red);

  float acc[G::ROWS_PER_LANE];
  weights_times_v<T, HEAD_DIM, BLOCK_SIZE, PF_MODE, PF_V, PF_DIST, PF_EVICT_LAST>(
      acc, logits, v_cache, block_table, r, seq_len, num_kv_heads, kv_head, policy);
  __syncthreads();  // the logits are dead: the same bytes now hold the cross-warp sums
  sum_over_warps<HEAD_DIM, G::V_VECS_PER_ROW, G::ROWS_PER_STEP>(acc, smem);

  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  if (warp == 0 && lane % G::V_VECS_PER_ROW == 0) {
    const int row0 = lane / G::V_VECS_PER_ROW;
#pragma unroll
    for (int i = 0; i < G::ROWS_PER_LANE; ++i) {
      const int row = row0 + i * G::ROWS_PER_STEP;
      if (row < HEAD_DIM) {
        if constexpr (PARTITION_SIZE > 0) {
          partial_out[(head_row * max_num_partitions + partition) * HEAD_DIM + row] = acc[i];
        } else {
          out[head_row * HEAD_DIM + row] = float_to<T>(acc[i]);
        }
      }
    }
  }
  if constexpr (PARTITION_SIZE > 0) {
    if (threadIdx.x == 0) {
      partial_max[head_row * max_num_partitions + partition] = max_sum.x;
      partial_sum[head_row * max_num_partitions + partition] = max_sum.y;
    }
  }
}

// ---- the reduce CTA (v2) ------------------------------------------------------------------------

template <typename T, int HEAD_DIM, int PARTITION_SIZE>
__device__ __forceinline__ void reduce_cta(T* out, const float* partial_out,
                                           const float* partial_max, const float* partial_sum,
                                           const int* seq_lens, int max_num_partitions,
                                           float* weights, float* red) {
  static_assert(PARTITION_SIZE > 0, "the reduce kernel merges v2 partitions");
  const int head = blockIdx.x, seq = blockIdx.y;
  const int64_t head_row = static_cast<int64_t>(seq) * gridDim.x + head;  // [seq, head]
  const int num_partitions = ceil_div(seq_lens[seq], PARTITION_SIZE);
  const float* p_out = partial_out + head_row * max_num_partitions * HEAD_DIM;  // [p, HEAD_DIM]
  const float* p_max = partial_max + head_row * max_num_partitions;            // [p]
  const float* p_sum = partial_sum + head_row * max_num_partitions;            // [p]
  T* o = out + head_row * HEAD_DIM;

  if (num_partitions == 1) {  // nothing to merge: partial_out is already normalized
    for (int d = threadIdx.x; d < HEAD_DIM; d += NUM_THREADS) o[d] = float_to<T>(p_out[d]);
    return;
  }

  float m = neg_inf();
  for (int p = threadIdx.x; p < num_partitions; p += NUM_THREADS) m = fmaxf(m, p_max[p]);
  m = block_reduce<true>(m, red);

  // Weight of partition p: s_p * exp(m_p - M), staged NUM_THREADS partitions at a time.
  constexpr int DIMS_PER_THREAD = (HEAD_DIM + NUM_THREADS - 1) / NUM_THREADS;
  float acc[DIMS_PER_THREAD];
#pragma unroll
  for (int k = 0; k < DIMS_PER_THREAD; ++k) acc[k] = 0.f;
  float sum = 0.f;
  for (int p0 = 0; p0 < num_partitions; p0 += NUM_THREADS) {
    const int p = p0 + threadIdx.x;
    const float w = p < num_partitions ? p_sum[p] * __expf(p_max[p] - m) : 0.f;
    weights[threadIdx.x] = w;
    sum += w;
    __syncthreads();
    const int num_here = imin(NUM_THREADS, num_partitions - p0);
#pragma unroll
    for (int k = 0; k < DIMS_PER_THREAD; ++k) {
      const int d = threadIdx.x + k * NUM_THREADS;
      if (d < HEAD_DIM) {
        for (int j = 0; j < num_here; ++j) {
          acc[k] = fmaf(p_out[static_cast<int64_t>(p0 + j) * HEAD_DIM + d], weights[j], acc[k]);
        }
      }
    }
    __syncthreads();  // before the next chunk overwrites `weights`
  }
  const float inv_sum = 1.f / block_reduce<false>(sum, red + NUM_WARPS);
#pragma unroll
  for (int k = 0; k < DIMS_PER_THREAD; ++k) {
    const int d = threadIdx.x + k * NUM_THREADS;
    if (d < HEAD_DIM) o[d] = float_to<T>(acc[k] * inv_sum);
  }
}

}  // namespace vllm

// ---- entry points (instantiated through CuPy name_expressions) ----------------------------------

// Decode: grid (num_qo_heads, num_seqs, PARTITION_SIZE ? max_num_partitions : 1), block 128,
// dynamic shared memory vllm::decode_smem_bytes(HEAD_DIM, BLOCK_SIZE, PARTITION_SIZE, max_seq_len).
// v1 writes `out` (partial_* may be null); v2 writes partial_* (out may be null).
// NOTE: the launch bounds ask ptxas for 5 CTAs an SM (at most 102 registers a thread), vLLM's v1
// occupancy, where that costs no spills: head_dim up to 128 at blocks 8 and 16 (93-96 registers
// at head_dim 128 under NVRTC; block 32 spilled 8 bytes). Elsewhere 1, which is no limit.
template <typename T, int HEAD_DIM, int BLOCK_SIZE, int PARTITION_SIZE, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST>
__global__ void __launch_bounds__(128, HEAD_DIM <= 128 && BLOCK_SIZE <= 16 ? 5 : 1) vllm_decode(
    T* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_max,
    float* __restrict__ partial_sum, const T* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, int max_num_blocks_per_seq, int num_kv_heads,
    int max_num_partitions, float scale) {
  extern __shared__ __align__(16) float vllm_decode_smem[];
  __shared__ float red[2 * vllm::NUM_WARPS];
  __shared__ uint4 q_smem[HEAD_DIM * sizeof(T) / 16];
  vllm::decode_cta<T, HEAD_DIM, BLOCK_SIZE, PARTITION_SIZE, PF_MODE, PF_K, PF_V, PF_DIST,
                   PF_EVICT_LAST>(out, partial_out, partial_max, partial_sum, q, k_cache, v_cache,
                                  block_tables, seq_lens, max_num_blocks_per_seq, num_kv_heads,
                                  max_num_partitions, scale, vllm_decode_smem, red, q_smem);
}

// Reduce (v2): grid (num_qo_heads, num_seqs), block 128, no dynamic shared memory.
template <typename T, int HEAD_DIM, int PARTITION_SIZE>
__global__ void __launch_bounds__(128) vllm_reduce(
    T* __restrict__ out, const float* __restrict__ partial_out,
    const float* __restrict__ partial_max, const float* __restrict__ partial_sum,
    const int* __restrict__ seq_lens, int max_num_partitions) {
  __shared__ float weights[vllm::NUM_THREADS];
  __shared__ float red[2 * vllm::NUM_WARPS];
  vllm::reduce_cta<T, HEAD_DIM, PARTITION_SIZE>(out, partial_out, partial_max, partial_sum,
                                                seq_lens, max_num_partitions, weights, red);
}

}  // namespace kvlab
