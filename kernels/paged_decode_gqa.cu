// Group-aware paged decode attention on the "hnd" cache layout: gqa_decode, and gqa_merge for
// split-KV. Design notes, versions and dead ends: docs/kernels/gqa.md.
// v13 (717010b): 98-106% of the H200's copy roofline from 256k tokens (attention.json, bcfeff1).
//
// What it computes: one decode step. For each sequence s and query head h, whose KV head is
// kv = h / GROUP, out[s, h] = softmax(scale * q[s, h] . K[s, kv]^T) . V[s, kv] over the
// seq_lens[s] cached tokens; token t lies in block block_tables[s, t / BLOCK_SIZE], row
// t % BLOCK_SIZE. Softmax and accumulation in fp32; P is rounded to the mma input type for PV.
//
// Tensors (contiguous; q and out 16-byte aligned):
//   q                 [num_seqs, num_qo_heads, HEAD_DIM]                     T
//   k_cache, v_cache  [num_blocks, num_kv_heads, BLOCK_SIZE, HEAD_DIM]       KV
//   k_scale, v_scale  [num_kv_heads] float, fp8 only (value = stored * scale); else null
//   block_tables      [num_seqs, max_num_blocks_per_seq] int32; ids past seq_len may be read
//                     (the prologue runs ahead of seq_len) but are never used
//   seq_lens          [num_seqs] int32, >= 0 (an empty sequence gets zeros)
//   work              null, or [num_items, 2] int32 (sequence, partition) items
//   out               [num_seqs, num_qo_heads, HEAD_DIM]                     T
//   partial_out       [num_seqs, num_qo_heads, max_num_partitions, HEAD_DIM] fp32, each
//                     partition normalised by its own sum
//   partial_lse       [num_seqs, num_qo_heads, max_num_partitions] fp32, each partition's
//                     log-sum-exp (natural log) of its scaled logits
//   seqs (merge)      null, or [num_merged] int32: the split sequences
//
// gqa_decode<T, KV, HEAD_DIM, BLOCK_SIZE, GROUP, PF_MODE, PF_K, PF_V, PF_DIST, PF_EVICT_LAST,
//            WARPS>
//   T            __half or __nv_bfloat16 (q, out).
//   KV           T, or kvlab::fp8_e4m3 with either T (then both mmas run in fp16).
//   HEAD_DIM     64, 80, 96, 112, 128, 256.      BLOCK_SIZE  a power of two in [8, 256].
//   GROUP        num_qo_heads / num_kv_heads, 1..8.
//   PF_MODE      kvlab::PF_NONE (prefetch compiled out), PF_BULK or PF_LINE (prefetch.cuh);
//                PF_K / PF_V which caches, PF_DIST tiles ahead (>= 1), PF_EVICT_LAST the tag.
//   WARPS        4, or 8 where Smem's stages for 8 warps fit an SM (not head_dim 256).
// gqa_merge<T, HEAD_DIM>: combines a split sequence's partitions by their log-sum-exp.
//
// Launch contract (kvlab/kernels/gqa.py):
//   gqa_decode: block 32 * WARPS threads, dynamic shared memory Smem<HEAD_DIM, sizeof(KV),
//     WARPS>::BYTES, above 48 KB at every head_dim: the caller raises
//     cudaFuncAttributeMaxDynamicSharedMemorySize before the first launch.
//     Grid (max_num_partitions, num_kv_heads, num_seqs) without a work list. With one, grid
//     (num_items * num_kv_heads, 1, 1): CTA x runs KV head x % num_kv_heads of work[x /
//     num_kv_heads], so an item's heads run together and the launch follows the list's order
//     (longest first, or long and short paired in one wave: geometry.one_wave_order). The list
//     names every sequence's partition 0 and only the other partitions that hold tokens.
//     partition_size is a multiple of 256; with max_num_partitions == 1 the one partition is the
//     whole sequence. A sequence of one partition is written to `out` by its decode CTA; the
//     partitions of a longer one go to partial_out / partial_lse for gqa_merge.
//   gqa_merge: grid (num_qo_heads, num_merged), block 128, no dynamic shared memory; CTA (h, i)
//     merges head h of seqs[i] (of sequence i, num_merged = num_seqs, where seqs is null) and
//     leaves sequences of one partition alone. Launched as a programmatic dependent of gqa_decode
//     (sm_90): decode CTAs signal griddepcontrol.launch_dependents at their start, the merge does
//     its index work, then griddepcontrol.wait, then reads the partials with ld.global.cg. CTA
//     (0, 0) always waits, so the merge grid ends after the decode grid. Launched plainly, both
//     instructions do nothing.
//   With KVLAB_TIMELINE defined, both kernels stamp each CTA's progress (timeline.cuh).
//
// Design. One CTA owns one (sequence, partition, KV head) and all GROUP query heads of that KV
// head, so each K/V byte is read from HBM once (a kernel per query head reads it GROUP times).
//   - Tiles: the partition is walked in tiles of 16 * WARPS tokens; warp w owns rows [16w, 16w +
//     16) of each tile. Partitions start at multiples of 256, so a warp's 16 rows lie in one block
//     (two consecutive blocks when BLOCK_SIZE == 8).
//   - Pipeline: each warp streams its own 16 K and 16 V rows into private shared-memory stages
//     with 16-byte cp.async.cg.L2::128B (3 stages for 16-bit caches, 5 for fp8: the same bytes
//     in flight), synchronised by cp.async.wait_group and __syncwarp only, no CTA barrier in the
//     loop. Rows at or past seq_len are zero-filled (src-size 0), so garbage there never reaches
//     the math. Block ids are looked up one iteration ahead so the table read overlaps the math.
//   - Math on tensor cores (mma.sync m16n8k16, fp32 accumulate):
//       S[head, token] = Q[16 x D] . K^T[D x 8 tokens]        (Q in registers; rows >= GROUP zero)
//       O^T[dim, head] += V^T[16 dims x 16 tokens] . P^T[16 tokens x 8 heads]
//     The S accumulators of two 8-token n-tiles are exactly P^T's B fragment, so P never leaves
//     registers. Padding rows of the QK mma cost tensor-core time, which is not the bottleneck.
//   - Online softmax in the log2 domain with a lazy rescale: m, l and O move to a new reference
//     only when some head's tile max passes m by more than RESCALE_SLACK (a warp vote), so
//     p <= 2^RESCALE_SLACK and most tiles skip the rescale.
//   - Shared-memory rows (Smem): a 16-bit row that fills whole 128-byte lines is stored unpadded
//     with its 16-byte chunks XOR-swizzled by the row, so each 32-byte cache sector lands in one
//     shared-memory sector (L2 serves it once) and an ldmatrix phase has no bank conflict. Other
//     rows, fp8's included, are padded to an odd multiple of 32 bytes: sectors land whole, at the
//     cost of a 2-way conflict.
//   - End: the warps' (m, l, O) meet in shared memory (aliasing the stages), 4 dims a thread. A
//     split CTA writes its normalised partial and lse; gqa_merge weighs each slot's partitions
//     against their own largest lse, so one barrier precedes the final sum.
//   - Split and order are the host's (geometry.split_plan): enough CTAs to keep HBM busy, a
//     makespan model of CTA waves, 8 warps a CTA only where lone CTAs of 4 cannot keep HBM busy.
//
// fp8 (e4m3, one float scale per KV head): values are widened to fp16 in registers
// (cvt.rn.f16x2.e4m3x2, exact) and both mmas run in fp16; the K scale joins the softmax scale,
// the V scale multiplies the output once. A bf16 q is converted to fp16 when loaded, each head
// first multiplied by the power of two 2^-s that puts its largest |entry| in [2^14, 2^15), with
// 2^s folded into its softmax scale: exact for entries within 2^28 of the head's largest, the
// smaller ones moved by at most 2^-39 of it. ldmatrix reads fp8 rows as b16 pairs, so a lane
// holds other dims than the fp16 path: for K, dims 4(lane%4)..+3 of a token, split into the
// fragment's k and k + 8 halves (Q's fragment takes the same dims, so the dot product is
// unchanged); for V (.trans), dims 2(lane/4) and 2(lane/4) + 1, which become output rows lane/4
// and lane/4 + 8 and are mapped back when the warps merge. At head_dim 80 and 112 the last
// ldmatrix reads 16 bytes of row padding, never used.
//
// L2 prefetch (arXiv 2504.06319, Algorithm 1, adapted): when a warp issues the copies of tile L
// it also prefetches its runs of tile L + PF_DIST into L2: one prefetch_tile_l2 call per
// contiguous (block, KV head) run of min(BLOCK_SIZE, 16 * WARPS) tokens, clipped to seq_len, by
// the warp whose rows start the run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "prefetch.cuh"
#include "timeline.cuh"

namespace kvlab {

// An fp8 element (e4m3, bit pattern only: the kernel widens pairs with cvt.rn.f16x2.e4m3x2).
struct fp8_e4m3 {
  unsigned char bits;
};

namespace gqa {

constexpr int WARP_TOKENS = 16;  // rows of a tile owned by one warp (a tile: 16 x WARPS rows)
constexpr int MAX_GROUP = 8;                           // the n-width of one mma
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
constexpr float RESCALE_SLACK = 8.f;  // log2 units: p and the O scale grow by at most 256x

template <bool C, typename A, typename B> struct Select { using type = A; };
template <typename A, typename B> struct Select<false, A, B> { using type = B; };
template <typename A, typename B> struct Same { static constexpr bool value = false; };
template <typename A> struct Same<A, A> { static constexpr bool value = true; };

// Shared-memory geometry, in bytes. One warp's K (or V) rows of one stage: [WARP_TOKENS][ROW_BYTES],
// in 16-byte chunks. A 16-bit row that fills whole 128-byte lines (head_dim 64, 128, 256) is
// stored unpadded with its chunks swizzled: chunk c of row r sits at chunk c ^ (r % 8). The 8 rows
// of an ldmatrix phase then read 8 different bank groups (no conflict), and the two chunks of a
// 32-byte cache sector stay in one 32-byte shared-memory sector (the XOR keeps or swaps them in
// place). Any other row, and every fp8 row (whose busier loop pays more for the XOR addressing
// than for the conflicts it removes: docs/kernels/gqa.md), is padded to the least odd multiple of
// 32 bytes that holds it (and, for fp8 at head_dim 80 and 112, the 16 bytes its last ldmatrix
// reads past it), chunks in order: a multiple of 32, so that the two chunks of a sector land in
// one shared-memory sector (a row 16 bytes off makes L2 serve that sector twice); odd, so that an
// ldmatrix phase meets a 2-way bank conflict, not more. Whole buffer: [STAGES][NUM_WARPS][K, V]
// [WARP_TOKENS][ROW_BYTES]. fp8 takes 5 stages to keep as many bytes in flight as 3 of 16 bits.
// CTAS_PER_SM is what shared memory allows on sm_90 (228 KB per SM, 1 KB reserved per CTA):
// 4 CTAs for head_dim 64, 3 for 80, 2 for 96..128, 1 for 256 (fp8: 3, 3, 3, 2, 2, 1).
// It is passed to __launch_bounds__ so that ptxas budgets registers for that occupancy (left to
// guess, it spills at head_dim 96).
template <int HEAD_DIM, int KV_BYTES, int WARPS> struct Smem {
  static constexpr int MIN_ROW_BYTES =
      HEAD_DIM * KV_BYTES + (KV_BYTES == 1 && HEAD_DIM % 32 != 0 ? 16 : 0);
  static constexpr bool SWIZZLE = KV_BYTES == 2 && MIN_ROW_BYTES % 128 == 0;
  static constexpr int ROW_BYTES =
      SWIZZLE ? MIN_ROW_BYTES : 32 * (((MIN_ROW_BYTES + 31) / 32) | 1);
  static constexpr int STAGES = KV_BYTES == 1 ? 5 : 3;
  static constexpr int WARP_TILE_BYTES = WARP_TOKENS * ROW_BYTES;
  static constexpr int BYTES = STAGES * WARPS * 2 * WARP_TILE_BYTES;  // the dynamic smem
  static constexpr int CTAS_PER_SM = (228 * 1024) / (BYTES + 1024);
  static_assert(CTAS_PER_SM >= 1, "WARPS: 8 only where its shared memory fits an SM");
  // What row `row`'s chunk indices are XORed with (host too: tests check the layout).
  static constexpr __host__ __device__ int key(int row) { return SWIZZLE ? row & 7 : 0; }
  // Byte offset of chunk `chunk` of row `row` in a warp's tile.
  static constexpr __host__ __device__ int at(int row, int chunk) {
    return row * ROW_BYTES + 16 * (chunk ^ key(row));
  }
};

// ---- small PTX helpers --------------------------------------------------------------------------

__device__ __forceinline__ unsigned smem_addr(const void* p) {  // generic -> .shared address
  unsigned addr;
  asm("{ .reg .u64 u; cvta.to.shared.u64 u, %1; cvt.u32.u64 %0, u; }" : "=r"(addr) : "l"(p));
  return addr;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }  // no <cmath>

// 16-byte global -> shared copy; when !valid nothing is read and the 16 bytes are zero-filled.
// .L2::128B lets L2 fetch the whole 128-byte line from HBM on the first miss.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)),
               "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)) : "memory");
}

// Two e4m3 values (the low byte first) widened to an fp16 pair, exactly.
__device__ __forceinline__ unsigned e4m3x2_to_half2(unsigned short pair) {
  unsigned out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(pair));
  return out;
}

__device__ __forceinline__ float2 bf16x2_to_float2(unsigned pair) {  // the low half is .x
  return make_float2(__uint_as_float(pair << 16), __uint_as_float(pair & 0xffff0000u));
}

__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: exp2(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// d[16x8, fp32] += a[16x16, row] * b[16x8, col]; fragments in the standard mma.m16n8k16 layout.
template <typename T> struct Mma;
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                             unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                             unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ unsigned pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
  }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

// ---- paging: which blocks hold a warp's 16 rows ------------------------------------------------

// Physical block ids of the rows [row0, row0 + 16) of the sequence: one id when BLOCK_SIZE >= 16,
// two (rows 0-7, 8-15) when BLOCK_SIZE == 8. Entries at or past `end` (= min(partition end,
// seq_len)) are never read from the block table (NOTE: it is padded with 0 there; we do not rely
// on that).
template <int BLOCK_SIZE> struct RowBlocks {
  static constexpr int N = BLOCK_SIZE >= WARP_TOKENS ? 1 : WARP_TOKENS / BLOCK_SIZE;  // 1 or 2
  static_assert(N <= 2, "of_row assumes at most two blocks per warp");
  int id[N];
  __device__ __forceinline__ void lookup(const int* __restrict__ table_row, int row0, int end) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int t = row0 + i * BLOCK_SIZE;
      id[i] = t < end ? table_row[t / BLOCK_SIZE] : 0;
    }
  }
  // The block of row r (0..15) of the warp: a select, not a runtime index (id[] stays in regs).
  __device__ __forceinline__ int of_row(int r) const {
    if constexpr (N == 1) return id[0];
    else return r < BLOCK_SIZE ? id[0] : id[1];
  }
};

// Element offset of the (block, kv head) tile: [num_blocks, num_kv_heads, BLOCK_SIZE, HEAD_DIM].
template <int HEAD_DIM, int BLOCK_SIZE>
__device__ __forceinline__ long long tile_offset(int block_id, int num_kv_heads, int kv_head) {
  return (static_cast<long long>(block_id) * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_DIM);
}

// ---- the decode body ---------------------------------------------------------------------------

template <typename T, typename KV, int HEAD_DIM, int BLOCK_SIZE, int GROUP, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST, int WARPS>
__device__ __forceinline__ void decode_body(
    T* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_lse,
    const T* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ work, int max_num_blocks_per_seq, int num_kv_heads,
    int partition_size, int max_num_partitions, float scale) {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 80 || HEAD_DIM == 96 || HEAD_DIM == 112 ||
                HEAD_DIM == 128 || HEAD_DIM == 256, "HEAD_DIM: 64, 80, 96, 112, 128 or 256");
  static_assert(BLOCK_SIZE >= 8 && BLOCK_SIZE <= 256 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                "BLOCK_SIZE: a power of two in [8, 256]");
  static_assert(GROUP >= 1 && GROUP <= MAX_GROUP, "GROUP: 1..8");
  static_assert(PF_MODE == PF_NONE || PF_MODE == PF_BULK || PF_MODE == PF_LINE, "PF_MODE");
  static_assert(PF_MODE == PF_NONE || PF_DIST >= 1, "PF_DIST: >= 1 tile");
  static_assert(sizeof(T) == 2, "T: __half or __nv_bfloat16");
  constexpr bool FP8 = sizeof(KV) == 1;
  static_assert(sizeof(KV) == sizeof(T) || FP8, "KV: T or fp8_e4m3");
  using MT = typename Select<FP8, __half, T>::type;  // the mmas' inputs: fp8 widens to fp16
  static_assert(WARPS == 4 || WARPS == 8, "WARPS: 4 or 8");
  using S = Smem<HEAD_DIM, sizeof(KV), WARPS>;
  constexpr int NUM_WARPS = WARPS;
  constexpr int NUM_THREADS = 32 * WARPS;
  constexpr int TILE_TOKENS = WARPS * WARP_TOKENS;  // tokens per main-loop iteration: 64 or 128
  constexpr int STAGES = S::STAGES;
  constexpr int K_STEPS = HEAD_DIM / 16;           // 16-dim k-steps of QK = 16-dim m-tiles of PV
  constexpr int ROW_BYTES = S::ROW_BYTES;          // smem row stride
  constexpr int VECS = HEAD_DIM * sizeof(KV) / 16;  // 16-byte vectors per row
  constexpr int VEC_ELEMS = 16 / sizeof(KV);
  constexpr int COPIES = (WARP_TOKENS * VECS + 31) / 32;  // cp.async per lane per cache per tile
  constexpr int RUN = BLOCK_SIZE < TILE_TOKENS ? BLOCK_SIZE : TILE_TOKENS;  // prefetch call, tokens
  constexpr bool PREFETCH = PF_MODE != PF_NONE && (PF_K || PF_V);

  namespace tl = timeline::decode;
  timeline::start(tl::REGION, tl::ENTRY);
  // the natural grid, or a work list of (sequence, partition) pairs (see the launch contract)
  const int item = blockIdx.x / num_kv_heads;
  const int partition = work ? work[2 * item + 1] : blockIdx.x;
  const int seq = work ? work[2 * item] : blockIdx.z;
  const int kv_head = work ? blockIdx.x % num_kv_heads : blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // seq_len, q and the first block ids are read together: one round trip before the first
  // cp.async, not two (the block ids do not wait for seq_len; see `first` below)
  const int seq_len = seq_lens[seq];
  const int partition_start = partition * partition_size;
  const int num_qo_heads = num_kv_heads * GROUP;
  const int* __restrict__ table_row =
      block_tables + static_cast<long long>(seq) * max_num_blocks_per_seq;  // this seq's row
  // fp8: stored K = K / k_scale, so the logits take k_scale; the output takes v_scale (below)
  float scale_log2 = scale * LOG2E * (FP8 ? k_scale[kv_head] : 1.f);
  const float out_scale = FP8 ? v_scale[kv_head] : 1.f;  // read now, not after the main loop

  unsigned long long policy = 0;
  if constexpr (PREFETCH && PF_EVICT_LAST) policy = make_evict_last_policy();

  // Shared memory: [STAGES][NUM_WARPS][K, V][WARP_TOKENS][ROW_BYTES].
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int WARP_TILE_BYTES = S::WARP_TILE_BYTES;
  auto stage_k = [&](int stage) {
    return smem_raw + (stage * NUM_WARPS + warp) * 2 * WARP_TILE_BYTES;
  };
  auto stage_v = [&](int stage) { return stage_k(stage) + WARP_TILE_BYTES; };
  auto warp_row0 = [&](int tile) {
    return partition_start + tile * TILE_TOKENS + warp * WARP_TOKENS;
  };

  // Q of the group as mma A fragments (rows = query heads, rows >= GROUP and 8..15 are zero):
  // q_frag[s][0] = Q[g][16s + 2(lane%4) + {0,1}], q_frag[s][1] = Q[g][16s + 8 + 2(lane%4) + {0,1}],
  // g = lane / 4; fp8: Q[g][16s + 4(lane%4) + {0,1}] and + {2,3}, the dims K's lane holds.
  // q is [num_seqs, num_qo_heads, HEAD_DIM]; the group's heads are consecutive.
  unsigned q_frag[K_STEPS][2];
  {
    const int g = lane / 4;
    const long long head = static_cast<long long>(seq) * num_qo_heads + kv_head * GROUP + g;
    const T* qg = q + head * HEAD_DIM + (FP8 ? 4 : 2) * (lane % 4);
    constexpr int HI = FP8 ? 2 : 8;  // where the k + 8 half of the fragment starts
#pragma unroll
    for (int s = 0; s < K_STEPS; ++s) {
      q_frag[s][0] = g < GROUP ? *reinterpret_cast<const unsigned*>(qg + 16 * s) : 0u;
      q_frag[s][1] = g < GROUP ? *reinterpret_cast<const unsigned*>(qg + 16 * s + HI) : 0u;
    }
    if constexpr (FP8 && !Same<T, __half>::value) {  // bf16 q to fp16 (see the header)
      float amax = 0.f;
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = bf16x2_to_float2(q_frag[s][h]);
          amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));  // the quad holds head g
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      // amax in [2^e, 2^(e+1)): q * 2^-shift has its largest |entry| in [2^14, 2^15)
      const int e = ((__float_as_int(amax) >> 23) & 0xff) - 127;
      const int shift = min(max(e - 14, -126), 126);
      const float down = __int_as_float((127 - shift) << 23);
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 f = bf16x2_to_float2(q_frag[s][h]);
          q_frag[s][h] = Mma<__half>::pack(f.x * down, f.y * down);
        }
      scale_log2 *= __int_as_float((127 + shift) << 23);  // this lane's logits are head g's
    }
  }

  // The block ids of the first STAGES tiles (and of the tiles they prefetch), read before
  // seq_len is known: bounded by the partition and the block table's row only, so an id past
  // seq_len may be padding or garbage. Such ids are never used: the copies and prefetches check
  // each row against partition_end.
  RowBlocks<BLOCK_SIZE> first[STAGES], pf_first[STAGES] = {};
  {
    const int table_end = max_num_blocks_per_seq * BLOCK_SIZE;
    const int bound = max_num_partitions == 1 ? table_end
                                              : min(partition_start + partition_size, table_end);
#pragma unroll
    for (int tile = 0; tile < STAGES; ++tile) {
      first[tile].lookup(table_row, warp_row0(tile), bound);
      if constexpr (PREFETCH) pf_first[tile].lookup(table_row, warp_row0(tile + PF_DIST), bound);
    }
  }

  timeline::stamp_after(tl::REGION, tl::READY, first[0].id[0] ^ seq_len);
  // NOTE: partition 0 always runs, so that an empty sequence still gets (zero) outputs.
  if (partition > 0 && partition_start >= seq_len) return;
  const int partition_end =
      max_num_partitions == 1 ? seq_len : min(partition_start + partition_size, seq_len);
  // 0 for an empty sequence (its partition 0 still writes zeros below)
  const int num_tiles = (partition_end - partition_start + TILE_TOKENS - 1) / TILE_TOKENS;

  // Copy this warp's 16 K and V rows of `tile` into `stage` (rows >= partition_end zero-filled).
  auto load_tile = [&](int tile, int stage, const RowBlocks<BLOCK_SIZE>& blocks) {
    const int row0 = warp_row0(tile);
    // warp-uniform: this warp's rows of the last tile are all empty
    if (row0 >= partition_end) return;
    unsigned char* const ks = stage_k(stage);
    unsigned char* const vs = stage_v(stage);
#pragma unroll
    for (int i = 0; i < COPIES; ++i) {
      const int c = lane + 32 * i;
      if ((WARP_TOKENS * VECS) % 32 != 0 && c >= WARP_TOKENS * VECS) break;  // fp8 d 80, 112
      const int r = c / VECS, v = c % VECS;
      // Row in its block: row0 is 16-aligned, so rows never wrap within a block when
      // BLOCK_SIZE >= 16, and with BLOCK_SIZE 8 rows 8..15 start the second block.
      const int row_in_block = (row0 & (BLOCK_SIZE - 1)) + (r & (BLOCK_SIZE - 1));
      const long long off =
          tile_offset<HEAD_DIM, BLOCK_SIZE>(blocks.of_row(r), num_kv_heads, kv_head) +
          row_in_block * HEAD_DIM + v * VEC_ELEMS;
      const bool valid = row0 + r < partition_end;
      cp_async_16(ks + S::at(r, v), valid ? k_cache + off : k_cache, valid);
      cp_async_16(vs + S::at(r, v), valid ? v_cache + off : v_cache, valid);
    }
  };

  // L2 prefetch of the runs of `tile` that start in this warp's rows.
  auto prefetch_tile = [&](int tile, const RowBlocks<BLOCK_SIZE>& blocks) {
    const int row0 = warp_row0(tile);
#pragma unroll
    for (int i = 0; i < RowBlocks<BLOCK_SIZE>::N; ++i) {
      if (RUN > WARP_TOKENS && (warp * WARP_TOKENS) % RUN != 0) continue;
      const int run0 = row0 + i * RUN;
      const int num_tokens = min(RUN, partition_end - run0);
      if (num_tokens <= 0) continue;
      const long long off = tile_offset<HEAD_DIM, BLOCK_SIZE>(blocks.id[i], num_kv_heads, kv_head) +
                            (run0 & (BLOCK_SIZE - 1)) * HEAD_DIM;
      const unsigned bytes = num_tokens * HEAD_DIM * sizeof(KV);
      if constexpr (PF_K)
        prefetch_tile_l2<PF_MODE, PF_EVICT_LAST>(k_cache + off, bytes, lane, 32, policy);
      if constexpr (PF_V)
        prefetch_tile_l2<PF_MODE, PF_EVICT_LAST>(v_cache + off, bytes, lane, 32, policy);
    }
  };

  // Online-softmax state. Lane holds head g = lane / 4 for m and its partial l (its 4 scores per
  // tile); o[s] is the O^T fragment of dims 16s..16s+15: o[s][0..1] = (dim 16s + lane/4, heads
  // 2(lane%4) + {0,1}), o[s][2..3] = same heads, dim + 8.
  float m = neg_inf(), l = 0.f;
  float o[K_STEPS][4];
#pragma unroll
  for (int s = 0; s < K_STEPS; ++s) o[s][0] = o[s][1] = o[s][2] = o[s][3] = 0.f;

  // ldmatrix: matrix j = lane / 8 covers tokens (j / 2) * 8 + (0..7), this lane's row lm_row, and
  // chunk (j % 2) of each pair of chunks the loop names by its even first one, c: dims (j % 2) * 8
  // + (0..7) of a 16-dim step (fp8: dims (j % 2) * 16 + (0..15), a step of its own). Since c is
  // even, c + j % 2 = c ^ (j % 2), and the lane's chunk is stored at c ^ lm_key (see Smem).
  const int lm_row = (lane / 16) * 8 + lane % 8;
  const int lm_key = ((lane / 8) % 2) ^ S::key(lm_row);
  auto lm_at = [&](int c) { return lm_row * ROW_BYTES + 16 * (c ^ lm_key); };

  auto compute_tile = [&](int tile, int stage) {
    const int row0 = warp_row0(tile);
    if (row0 >= partition_end) return;  // warp-uniform
    const unsigned char* const ks = stage_k(stage);
    const unsigned char* const vs = stage_v(stage);

    // S[head][token] for tokens 0-7 (s_acc[0]) and 8-15 (s_acc[1]); rows 8-15 of the mma unused.
    float s_acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (FP8) {
#pragma unroll
      for (int s = 0; s < K_STEPS; s += 2) {  // one ldmatrix: steps s (kb0, kb2), s + 1 (kb1, kb3)
        unsigned kb[4];
        ldmatrix_x4(kb, ks + lm_at(s));
#pragma unroll
        for (int j = 0; j < 2 && s + j < K_STEPS; ++j) {
          const unsigned lo = kb[j], hi = kb[2 + j];  // tokens 0-7, 8-15
          Mma<MT>::run(s_acc[0], q_frag[s + j][0], 0u, q_frag[s + j][1], 0u,
                       e4m3x2_to_half2(lo & 0xffff), e4m3x2_to_half2(lo >> 16));
          Mma<MT>::run(s_acc[1], q_frag[s + j][0], 0u, q_frag[s + j][1], 0u,
                       e4m3x2_to_half2(hi & 0xffff), e4m3x2_to_half2(hi >> 16));
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        unsigned kb[4];  // B fragments: tokens 0-7 {kb0, kb1}, tokens 8-15 {kb2, kb3}
        ldmatrix_x4(kb, ks + lm_at(2 * s));
        Mma<MT>::run(s_acc[0], q_frag[s][0], 0u, q_frag[s][1], 0u, kb[0], kb[1]);
        Mma<MT>::run(s_acc[1], q_frag[s][0], 0u, q_frag[s][1], 0u, kb[2], kb[3]);
      }
    }

    // Scaled logits (log2 domain) of tokens row0 + 8n + 2(lane%4) + j; masked past partition_end.
    float x[2][2];
    float tile_max = neg_inf();
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool valid = row0 + 8 * n + 2 * (lane % 4) + j < partition_end;
        x[n][j] = valid ? s_acc[n][j] * scale_log2 : neg_inf();
        tile_max = fmaxf(tile_max, x[n][j]);
      }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    // Lazy rescale: m, l and O move to a new reference only when some head's tile max passes its
    // m by more than RESCALE_SLACK (warp-uniform); otherwise p = exp2(x - m) <= 2^RESCALE_SLACK.
    if (__any_sync(0xffffffffu, tile_max > m + RESCALE_SLACK)) {
      const float m_new = fmaxf(m, tile_max);
      const float alpha = fast_exp2(m - (m_new == neg_inf() ? 0.f : m_new));  // m = -inf: 0
      l *= alpha;
      m = m_new;
      // O^T columns of this lane are heads 2(lane%4) and 2(lane%4) + 1: fetch their alpha.
      const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * (lane % 4));
      const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * (lane % 4) + 4);
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        o[s][0] *= alpha0; o[s][1] *= alpha1; o[s][2] *= alpha0; o[s][3] *= alpha1;
      }
    }
    const float m_ref = m == neg_inf() ? 0.f : m;  // no valid token yet: keep p = 0
    float p[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) p[n][j] = fast_exp2(x[n][j] - m_ref);
    l += (p[0][0] + p[0][1]) + (p[1][0] + p[1][1]);

    // P^T as the mma B fragment: (tokens 2(lane%4) + {0,1}, head lane/4) and tokens + 8.
    const unsigned pb0 = Mma<MT>::pack(p[0][0], p[0][1]);
    const unsigned pb1 = Mma<MT>::pack(p[1][0], p[1][1]);
    if constexpr (FP8) {
#pragma unroll
      for (int s = 0; s < K_STEPS; s += 2) {  // one ldmatrix: m-tiles s (vt0, vt2), s + 1 (vt1, vt3)
        unsigned vt[4];  // lane: tokens 2(lane%4), +1 (low, high half) x dims 2(lane/4), +1
        ldmatrix_x4_trans(vt, vs + lm_at(s));
#pragma unroll
        for (int j = 0; j < 2 && s + j < K_STEPS; ++j) {
          const unsigned lo = vt[j], hi = vt[2 + j];  // tokens 0-7, 8-15
          // rows lane/4 <- dim 2(lane/4) (bytes 0, 2), rows lane/4 + 8 <- dim 2(lane/4) + 1
          const unsigned a0 = e4m3x2_to_half2(__byte_perm(lo, 0u, 0x0020) & 0xffff);
          const unsigned a1 = e4m3x2_to_half2(__byte_perm(lo, 0u, 0x0031) & 0xffff);
          const unsigned a2 = e4m3x2_to_half2(__byte_perm(hi, 0u, 0x0020) & 0xffff);
          const unsigned a3 = e4m3x2_to_half2(__byte_perm(hi, 0u, 0x0031) & 0xffff);
          Mma<MT>::run(o[s + j], a0, a1, a2, a3, pb0, pb1);
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < K_STEPS; ++s) {
        unsigned va[4];  // A fragment of V^T[dims 16s.., tokens 0-15]
        ldmatrix_x4_trans(va, vs + lm_at(2 * s));
        Mma<MT>::run(o[s], va[0], va[1], va[2], va[3], pb0, pb1);
      }
    }
  };

  // ---- main loop: per-warp pipeline of STAGES stages ----------------------------------------
#pragma unroll
  for (int tile = 0; tile < STAGES - 1; ++tile) {
    if (tile < num_tiles) {
      load_tile(tile, tile, first[tile]);
      if constexpr (PREFETCH) {
        if (tile + PF_DIST < num_tiles) prefetch_tile(tile + PF_DIST, pf_first[tile]);
      }
    }
    cp_async_commit();
  }
  timeline::stamp(tl::REGION, tl::ISSUED);
  // Block ids for the next load (and its prefetch) are looked up one iteration early, so the
  // block-table read overlaps the math instead of stalling the cp.async issue.
  RowBlocks<BLOCK_SIZE> blocks = first[STAGES - 1], pf_blocks = pf_first[STAGES - 1];

  int read_stage = 0, write_stage = STAGES - 1;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int next = tile + STAGES - 1;  // tile to load now, into the stage read last iteration
    __syncwarp();                        // every lane is done reading write_stage
    if (next < num_tiles) {
      load_tile(next, write_stage, blocks);
      if constexpr (PREFETCH) {
        if (next + PF_DIST < num_tiles) prefetch_tile(next + PF_DIST, pf_blocks);
      }
    }
    cp_async_commit();  // always, possibly empty: keeps "tile t = group t" for wait_group
    blocks.lookup(table_row, warp_row0(next + 1), partition_end);
    if constexpr (PREFETCH)
      pf_blocks.lookup(table_row, warp_row0(next + 1 + PF_DIST), partition_end);

    cp_async_wait<STAGES - 1>();  // this lane's copies of `tile` have landed ...
    __syncwarp();                 // ... and every lane's are visible to the warp
    if (tile == 0) timeline::stamp(tl::REGION, tl::LANDED);
    compute_tile(tile, read_stage);
    read_stage = read_stage == STAGES - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == STAGES - 1 ? 0 : write_stage + 1;
  }
  cp_async_wait<0>();  // only empty groups remain; drained before the stages are reused
  __syncthreads();     // all warps done with the stages
  timeline::stamp(tl::REGION, tl::LOOP_DONE);

  // ---- merge the WARPS warps (aliases the stages) -------------------------------------------
  // red_o [NUM_WARPS][MAX_GROUP][HEAD_DIM + 4] fp32 (the +4 spreads a warp's stores over 32 banks),
  // red_m, red_l [NUM_WARPS][MAX_GROUP].
  constexpr int RED_ROW = HEAD_DIM + 4;
  static_assert((NUM_WARPS * MAX_GROUP * (RED_ROW + 2)) * 4 <= S::BYTES, "smem");
  float* const red_o = reinterpret_cast<float*>(smem_raw);
  float* const red_m = red_o + NUM_WARPS * MAX_GROUP * RED_ROW;
  float* const red_l = red_m + NUM_WARPS * MAX_GROUP;
  l += __shfl_xor_sync(0xffffffffu, l, 1);  // the quad's partial sums share one m
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (lane % 4 == 0) {
    red_m[warp * MAX_GROUP + lane / 4] = m;
    red_l[warp * MAX_GROUP + lane / 4] = l;
  }
  {
    float* const w_o = red_o + warp * MAX_GROUP * RED_ROW;
    // rows lane/4 and lane/4 + 8 of the O^T fragment: dims d0 and d1 (fp8: see the header)
    const int h0 = 2 * (lane % 4);
    const int d0 = FP8 ? 2 * (lane / 4) : lane / 4, d1 = FP8 ? d0 + 1 : d0 + 8;
#pragma unroll
    for (int s = 0; s < K_STEPS; ++s) {
      w_o[h0 * RED_ROW + 16 * s + d0] = o[s][0];
      w_o[(h0 + 1) * RED_ROW + 16 * s + d0] = o[s][1];
      w_o[h0 * RED_ROW + 16 * s + d1] = o[s][2];
      w_o[(h0 + 1) * RED_ROW + 16 * s + d1] = o[s][3];
    }
  }
  __syncthreads();

  // out / partial_out rows of the group: [.., kv_head * GROUP + g, ..]. A thread combines 4
  // consecutive dims of one head: the warps' weights once, float4 reads and one store. A
  // sequence of one partition is written whole: the merge skips it.
  const bool whole = max_num_partitions == 1 || seq_len <= partition_size;
  constexpr int CHUNKS = HEAD_DIM / 4;
  for (int idx = threadIdx.x; idx < GROUP * CHUNKS; idx += NUM_THREADS) {
    const int g = idx / CHUNKS, d = 4 * (idx % CHUNKS);
    float mw[NUM_WARPS], m_max = neg_inf();
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      mw[w] = red_m[w * MAX_GROUP + g];
      m_max = fmaxf(m_max, mw[w]);
    }
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      const float f = mw[w] == neg_inf() ? 0.f : fast_exp2(mw[w] - m_max);  // no tokens: 0
      sum += f * red_l[w * MAX_GROUP + g];
      const float4 ow =
          *reinterpret_cast<const float4*>(red_o + (w * MAX_GROUP + g) * RED_ROW + d);
      acc.x += f * ow.x; acc.y += f * ow.y; acc.z += f * ow.z; acc.w += f * ow.w;
    }
    const float norm = sum > 0.f ? out_scale / sum : 0.f;
    acc.x *= norm; acc.y *= norm; acc.z *= norm; acc.w *= norm;
    const long long head = static_cast<long long>(seq) * num_qo_heads + kv_head * GROUP + g;
    if (whole) {
      *reinterpret_cast<uint2*>(out + head * HEAD_DIM + d) =
          make_uint2(Mma<T>::pack(acc.x, acc.y), Mma<T>::pack(acc.z, acc.w));
    } else {
      *reinterpret_cast<float4*>(partial_out + (head * max_num_partitions + partition) * HEAD_DIM +
                                 d) = acc;
      if (d == 0)
        partial_lse[head * max_num_partitions + partition] =
            sum > 0.f ? (m_max + __log2f(sum)) * LN2 : neg_inf();
    }
  }
  timeline::stamp(tl::REGION, tl::END);
}

}  // namespace gqa

// ---- entry points (instantiated through CuPy name_expressions) ----------------------------

// out [num_seqs, num_qo_heads, HEAD_DIM] T (written here for a sequence of one partition);
// partial_out [num_seqs, num_qo_heads, max_num_partitions, HEAD_DIM] fp32;
// partial_lse [num_seqs, num_qo_heads, max_num_partitions] fp32;
// q [num_seqs, num_qo_heads, HEAD_DIM] T; k_cache, v_cache [num_blocks, num_kv_heads, BLOCK_SIZE,
// HEAD_DIM] KV; k_scale, v_scale [num_kv_heads] float (fp8) or null; block_tables [num_seqs,
// max_num_blocks_per_seq] int32; seq_lens [num_seqs] int32; work null, or [num_items, 2] int32
// (sequence, partition) pairs, num_kv_heads CTAs each: grid (num_items * num_kv_heads, 1, 1).
// grid (max_num_partitions, num_kv_heads, num_seqs) without a work list, block 32 * WARPS,
// dynamic smem gqa::Smem<HEAD_DIM, sizeof(KV), WARPS>::BYTES.
// (__launch_bounds__ adds the shared-memory occupancy as min blocks; the launch is unchanged.)
template <typename T, typename KV, int HEAD_DIM, int BLOCK_SIZE, int GROUP, int PF_MODE, bool PF_K,
          bool PF_V, int PF_DIST, bool PF_EVICT_LAST, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, gqa::Smem<HEAD_DIM, sizeof(KV), WARPS>::CTAS_PER_SM)
    gqa_decode(
    T* __restrict__ out, float* __restrict__ partial_out, float* __restrict__ partial_lse,
    const T* __restrict__ q, const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ work, int max_num_blocks_per_seq, int num_kv_heads,
    int partition_size, int max_num_partitions, float scale) {
#if __CUDA_ARCH__ >= 900
  // the merge (a programmatic dependent launch) may start now: it waits for this grid's results
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  gqa::decode_body<T, KV, HEAD_DIM, BLOCK_SIZE, GROUP, PF_MODE, PF_K, PF_V, PF_DIST,
                   PF_EVICT_LAST, WARPS>(
      out, partial_out, partial_lse, q, k_cache, v_cache, k_scale, v_scale, block_tables,
      seq_lens, work, max_num_blocks_per_seq, num_kv_heads, partition_size, max_num_partitions,
      scale);
}

// Combine the partitions of each (sequence, query head):
// out = sum_c w_c partial_out_c / sum_c w_c with w_c = exp(lse_c - max lse). Sequence s has
// ceil(seq_lens[s] / partition_size) partitions (at most max_num_partitions); one of one
// partition is left alone (gqa_decode wrote it).
// grid (num_qo_heads, num_merged), block 128, no dynamic shared memory: CTA (h, i) merges head h
// of sequence seqs[i], or of sequence i where seqs is null.
// The partial rows are read as float4: VECS = HEAD_DIM / 4 threads cover one partition's row, and
// the block reads ROWS = 128 / VECS partitions at a time: thread (slot, vec) sums dims
// 4 vec .. 4 vec + 3 over partitions slot, slot + ROWS, ..., weighted against the largest lse of
// those partitions only, so no reduction over the block precedes the sums. Each thread loads its
// first LOADS rows and their lse together (up to ROWS x LOADS partitions, 64 at head_dim 128, in
// one round trip from L2), and the ROWS partial sums meet in shared memory once, rescaled by
// their slots' largest lse.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(128) gqa_merge(
    T* __restrict__ out, const float* __restrict__ partial_out,
    const float* __restrict__ partial_lse, const int* __restrict__ seq_lens,
    const int* __restrict__ seqs, int partition_size, int max_num_partitions) {
  constexpr int THREADS = 128;
  constexpr int VECS = HEAD_DIM / 4;      // float4 per partial row: 16 .. 64
  constexpr int ROWS = THREADS / VECS;    // partitions read at once: 2 .. 8
  namespace tl = timeline::merge;
  timeline::start(tl::REGION, tl::ENTRY);
  const int head = blockIdx.x, seq = seqs ? seqs[blockIdx.y] : blockIdx.y;
  const int num_qo_heads = gridDim.x;
  // gqa_decode does not write seq_lens: read it, and work out what to load, while the decode
  // grid still runs
  const int seq_len = seq_lens[seq];
  const int num_partitions =
      seq_len > 0 ? min((seq_len + partition_size - 1) / partition_size, max_num_partitions) : 0;
  const long long row = static_cast<long long>(seq) * num_qo_heads + head;
  const float* __restrict__ lse = partial_lse + row * max_num_partitions;  // [max_num_partitions]
  const float4* __restrict__ po =
      reinterpret_cast<const float4*>(partial_out + row * max_num_partitions * HEAD_DIM);

  constexpr int LOADS = 16;
  const int slot = threadIdx.x / VECS, vec = threadIdx.x % VECS;
  const bool reads = slot < ROWS;  // 128 % VECS threads idle for head_dim 80, 96, 112
  const int num_mine = reads ? (num_partitions - slot + ROWS - 1) / ROWS : 0;  // this slot's
  // gqa_decode wrote the out of a sequence of one partition itself: nothing to merge. CTA (0, 0)
  // still waits, so the merge grid ends after the decode grid whatever the lengths.
  const bool merges = num_partitions > 1;
  if (!merges && (blockIdx.x | blockIdx.y) != 0) return;
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of gqa_decode: wait until its partials are written.
  // The test on num_mine (never negative) keeps the work above ahead of the wait: without
  // one ptxas issues the wait first, and the seq_len round trip follows the decode grid's end.
  if (num_mine >= 0) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  timeline::stamp(tl::REGION, tl::RELEASED);
  if (!merges) return;
  // The partials are read with ld.global.cg (__ldcg), not through the read-only path that
  // `const __restrict__` allows: ptxas may hoist read-only loads above the wait, and they would
  // then read the partials before the decode grid wrote them.
  float4 first[LOADS];
  float first_lse[LOADS];
#pragma unroll
  for (int i = 0; i < LOADS; ++i) {
    const int c = slot + i * ROWS;
    first[i] = i < num_mine ? __ldcg(po + static_cast<long long>(c) * VECS + vec)
                            : make_float4(0.f, 0.f, 0.f, 0.f);
    first_lse[i] = i < num_mine ? __ldcg(lse + c) : gqa::neg_inf();
  }
  float m = gqa::neg_inf();  // the largest lse of this slot's partitions
#pragma unroll
  for (int i = 0; i < LOADS; ++i) m = fmaxf(m, first_lse[i]);
  for (int i = LOADS; i < num_mine; ++i) m = fmaxf(m, __ldcg(lse + slot + i * ROWS));
  const float shift = m == gqa::neg_inf() ? 0.f : m;  // no partition: every weight is 0

  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float lse_c, float4 p) {
    const float w = __expf(lse_c - shift);
    sum += w;
    acc.x += w * p.x; acc.y += w * p.y; acc.z += w * p.z; acc.w += w * p.w;
  };
#pragma unroll
  for (int i = 0; i < LOADS; ++i) add(first_lse[i], first[i]);  // past num_mine: w = 0, p = 0
  timeline::stamp_after(tl::REGION, tl::LOADED, acc.x);
#pragma unroll 4
  for (int i = LOADS; i < num_mine; ++i) {
    const int c = slot + i * ROWS;
    add(__ldcg(lse + c), __ldcg(po + static_cast<long long>(c) * VECS + vec));
  }

  __shared__ float4 red[ROWS][VECS];
  __shared__ float red_m[ROWS], red_sum[ROWS];
  if (reads) {
    red[slot][vec] = acc;
    if (vec == 0) {
      red_m[slot] = m;
      red_sum[slot] = sum;
    }
  }
  __syncthreads();
  float m_max = gqa::neg_inf();
#pragma unroll
  for (int r = 0; r < ROWS; ++r) m_max = fmaxf(m_max, red_m[r]);
  float f[ROWS], weights = 0.f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    f[r] = red_m[r] == gqa::neg_inf() ? 0.f : __expf(red_m[r] - m_max);  // a slot with none: 0
    weights += f[r] * red_sum[r];
  }
  for (int d = threadIdx.x; d < HEAD_DIM; d += THREADS) {
    float value = 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) value += f[r] * reinterpret_cast<const float*>(red[r])[d];
    out[row * HEAD_DIM + d] = gqa::Mma<T>::from_float(weights > 0.f ? value / weights : 0.f);
  }
  timeline::stamp(tl::REGION, tl::END);
}

}  // namespace kvlab
