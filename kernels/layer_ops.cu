// The small ops of a decoder layer's decode step, each one kernel.
// Design notes, measurements and dead ends: docs/kernels/layer_ops.md.
// Current (4ea9e7d): at one or two rows the norms and RoPE inside the linears, five launches a
// layer with the attention; a layer's work but the attention 0.1-2.3 us faster at one row than
// with them apart (an H100 session probe).
//
// A decode step of a real-size model spends most of its time in GEMMs that read the weights;
// what is left is a few dozen small ops a layer, each of which costs a launch however little it
// computes, and several launches when composed from torch ops. Here each is one launch, and some
// share one: RoPE of Q and K with the cache write (rope_write), the residual add or SwiGLU's
// product in the epilogue of the linear before them, and at one or two rows the norms in the
// linear after them (linear_rope_write: the attention norm, QKV, RoPE and the write together). The arithmetic follows the torch ops they
// replace (fp32 inside, and the same roundings to T where the torch composition rounds), so they
// agree to T's precision.
//
// Template parameter T: __half or __nv_bfloat16. Launch contracts are in kvlab/kernels/layer_ops.py,
// which checks shapes, strides and alignment before launching.

#include "dtypes.cuh"
#include "prefetch_ahead.cuh"

namespace kvlab {

constexpr int VEC = 8;  // elements of T in one 16-byte vector

// x rounded to T and back: where the torch ops these replace round between two steps.
template <typename T>
__device__ __forceinline__ float rounded(float x) { return to_float(float_to<T>(x)); }

// SwiGLU's product of one element, as torch's F.silu(gate) * up rounds it (silu to T first)
template <typename T>
__device__ __forceinline__ float silu_times(float gate, float up) {
    return rounded<T>(gate / (1.0f + __expf(-gate))) * up;
}

// Sum of `value` over the CTA (blockDim.x a multiple of 32, at most 1024), returned to all.
__device__ float cta_sum(float value) {
    __shared__ float warp_sums[32];
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[warp] = value;
    __syncthreads();
    value = lane < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

// RMSNorm of a row per CTA, after an optional residual add:
//   h = a[row] + b[row] (rounded to T; written to sum[row]) where b is given, else h = a[row];
//   out[row] = weight * T(h * rsqrt(mean(h^2) + eps))      (HF's LlamaRMSNorm: two roundings)
// Rows are contiguous, `hidden` a multiple of VEC; each thread keeps VECS vectors of its row in
// registers, so hidden <= VECS * VEC * blockDim.x. Pointers 16-byte aligned.
// ahead, ahead_bytes: the cross-kernel prefetch (prefetch_ahead.cuh; off with ahead_bytes 0):
// the CTAs' first warps bring the first ahead_bytes at `ahead` (the next GEMM's weight) into L2,
// an equal share each, as the kernel starts.
template <typename T, int VECS>
__global__ void rms_norm(T* __restrict__ out, T* __restrict__ sum, const T* __restrict__ a,
                         const T* __restrict__ b, const T* __restrict__ weight, float eps,
                         int hidden, const void* __restrict__ ahead, long long ahead_bytes) {
    if (threadIdx.x < 32)
        prefetch_share_l2(ahead, ahead_bytes, blockIdx.x, gridDim.x, threadIdx.x);
    const size_t row = static_cast<size_t>(blockIdx.x) * hidden;
    float h[VECS][VEC];
    float squares = 0.0f;
#pragma unroll
    for (int j = 0; j < VECS; ++j) {
        const int i = (threadIdx.x + j * blockDim.x) * VEC;
        if (i >= hidden) break;
        uint4 raw = *reinterpret_cast<const uint4*>(a + row + i);
        T* x = reinterpret_cast<T*>(&raw);
        if (b != nullptr) {
            uint4 raw_b = *reinterpret_cast<const uint4*>(b + row + i);
            const T* y = reinterpret_cast<const T*>(&raw_b);
#pragma unroll
            for (int k = 0; k < VEC; ++k) x[k] = float_to<T>(to_float(x[k]) + to_float(y[k]));
            *reinterpret_cast<uint4*>(sum + row + i) = raw;
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            h[j][k] = to_float(x[k]);
            squares += h[j][k] * h[j][k];
        }
    }
    const float inv_rms = rsqrtf(cta_sum(squares) / hidden + eps);
#pragma unroll
    for (int j = 0; j < VECS; ++j) {
        const int i = (threadIdx.x + j * blockDim.x) * VEC;
        if (i >= hidden) break;
        uint4 raw_w = *reinterpret_cast<const uint4*>(weight + i);
        const T* w = reinterpret_cast<const T*>(&raw_w);
        uint4 result;
        T* o = reinterpret_cast<T*>(&result);
#pragma unroll
        for (int k = 0; k < VEC; ++k) o[k] = float_to<T>(to_float(w[k]) * rounded<T>(h[j][k] * inv_rms));
        *reinterpret_cast<uint4*>(out + row + i) = result;
    }
}

// Rotary embedding, half-split pairs (x[i], x[i + d/2]) as Llama and Qwen2 rotate them:
//   out[i]       = x[i] cos[p, i]             - x[i + d/2] sin[p, i]
//   out[i + d/2] = x[i + d/2] cos[p, i + d/2] + x[i] sin[p, i + d/2]
// at position p, cos and sin the [max_positions, 2 half] tables (a position outside them gives
// zeros, never a read outside): pair i of a head, x1 = x[i] and x2 = x[i + half] (values of T),
// into *first and *second.
template <typename T>
__device__ __forceinline__ void rotate_pair(T* first, T* second, float x1, float x2, int i,
                                            int half, const T* __restrict__ cos,
                                            const T* __restrict__ sin, long long position,
                                            long long max_positions) {
    if (position < 0 || position >= max_positions) {
        *first = *second = float_to<T>(0.0f);
        return;
    }
    const long long table = position * 2 * half;
    // torch: x * cos (rounded), then + rotated * sin
    *first = float_to<T>(rounded<T>(x1 * to_float(cos[table + i])) - x2 * to_float(sin[table + i]));
    *second = float_to<T>(rounded<T>(x2 * to_float(cos[table + i + half])) +
                          x1 * to_float(sin[table + i + half]));
}

// RoPE of x [rows, heads, head_dim] at positions[row] into out, both with row strides of their
// own (x may be a view into a fused QKV output), heads contiguous; out may be x.
// Grid (rows, ceil(heads * head_dim / 2 / blockDim.x)).
template <typename T>
__global__ void rope(T* out, const T* x, const T* __restrict__ cos, const T* __restrict__ sin,
                     const long long* __restrict__ positions, long long max_positions, int heads,
                     int head_dim, long long x_row_stride, long long out_row_stride) {
    const int half = head_dim / 2;
    const int pair = blockIdx.y * blockDim.x + threadIdx.x;
    if (pair >= heads * half) return;
    const int head = pair / half, i = pair % half;
    const T* src = x + blockIdx.x * x_row_stride + head * head_dim;
    T* dst = out + blockIdx.x * out_row_stride + head * head_dim;
    rotate_pair(dst + i, dst + i + half, to_float(src[i]), to_float(src[i + half]), i, half, cos,
                sin, positions[blockIdx.x], max_positions);
}

// Where element d of one token's K (IS_K) or V lies in a paged cache, counted in elements:
// block_head = block id * num_kv_heads + head, offset = the token's row in its block.
// Layouts (kvlab.cache.paged_cache): VLLM false: "hnd", both [blocks, heads, block_size, d];
// VLLM true: "vllm", k [blocks, heads, d / VEC, block_size, VEC] and v [blocks, heads, d,
// block_size].
template <bool VLLM, bool IS_K>
__device__ __forceinline__ long long cache_at(long long block_head, int offset, int block_size,
                                              int head_dim, int d) {
    if (!VLLM) return (block_head * block_size + offset) * head_dim + d;
    if (IS_K)
        return ((block_head * (head_dim / VEC) + d / VEC) * block_size + offset) * VEC + d % VEC;
    return (block_head * head_dim + d) * block_size + offset;
}

// Write the K and V of `rows` new tokens into a paged cache at their slots (block id * block_size
// + offset). k, v: [rows, num_kv_heads, head_dim], heads contiguous, row strides of their own;
// the layouts are cache_at's. A slot outside [0, num_blocks * block_size) is skipped, never
// written. Grid (rows), each thread one 16-byte vector of K and of V at a time.
template <typename T, bool VLLM>
__global__ void write_kv(T* __restrict__ k_cache, T* __restrict__ v_cache, const T* __restrict__ k,
                         const T* __restrict__ v, const long long* __restrict__ slots,
                         long long num_blocks, int block_size, int num_kv_heads, int head_dim,
                         long long k_row_stride, long long v_row_stride) {
    const long long slot = slots[blockIdx.x];
    if (slot < 0 || slot >= num_blocks * block_size) return;
    const long long block = slot / block_size;
    const int offset = static_cast<int>(slot % block_size);
    const int chunks = head_dim / VEC;
    for (int t = threadIdx.x; t < num_kv_heads * chunks; t += blockDim.x) {
        const int head = t / chunks, d = t % chunks * VEC;
        const uint4 k_vec =
            *reinterpret_cast<const uint4*>(k + blockIdx.x * k_row_stride + head * head_dim + d);
        const uint4 v_vec =
            *reinterpret_cast<const uint4*>(v + blockIdx.x * v_row_stride + head * head_dim + d);
        const long long block_head = block * num_kv_heads + head;
        // K's VEC elements are contiguous in both layouts (d is a multiple of VEC)
        *reinterpret_cast<uint4*>(
            k_cache + cache_at<VLLM, true>(block_head, offset, block_size, head_dim, d)) = k_vec;
        if (!VLLM) {
            *reinterpret_cast<uint4*>(
                v_cache + cache_at<VLLM, false>(block_head, offset, block_size, head_dim, d)) =
                v_vec;
        } else {  // V's are block_size apart
            const T* values = reinterpret_cast<const T*>(&v_vec);
#pragma unroll
            for (int e = 0; e < VEC; ++e)
                v_cache[cache_at<VLLM, false>(block_head, offset, block_size, head_dim, d + e)] =
                    values[e];
        }
    }
}

// Where a RoPE layer's new tokens go from their QKV output (the Q, K, V heads in turn): Q
// rotated into q_out [rows, q_heads, head_dim] contiguous (`rope`), K rotated and V written into
// a paged cache at the rows' slots (`write_kv`; a slot outside the cache is skipped), in the
// layouts of cache_at. positions, slots: [rows].
template <typename T>
struct RopeWrite {
    T* q_out;
    T* k_cache;
    T* v_cache;
    const T* cos;
    const T* sin;
    const long long* positions;
    long long max_positions;
    const long long* slots;
    long long num_blocks;
    int block_size, q_heads, kv_heads, head_dim;
};

// A kernel's RopeWrite parameters, in its order, and the RopeWrite of them
#define ROPE_WRITE_PARAMS                                                                        \
    T *__restrict__ q_out, T *__restrict__ k_cache, T *__restrict__ v_cache,                    \
        const T *__restrict__ cos, const T *__restrict__ sin,                                   \
        const long long *__restrict__ positions, long long max_positions,                       \
        const long long *__restrict__ slots, long long num_blocks, int block_size, int q_heads, \
        int kv_heads, int head_dim
#define ROPE_WRITE                                                                               \
    RopeWrite<T> {                                                                               \
        q_out, k_cache, v_cache, cos, sin, positions, max_positions, slots, num_blocks,          \
            block_size, q_heads, kv_heads, head_dim                                              \
    }

// Pair i of head `head` of row `row`'s QKV output, x1 = x[i] and x2 = x[i + head_dim / 2]
// (values of T), to where `to` puts it.
template <typename T, bool VLLM>
__device__ __forceinline__ void rope_write_pair(const RopeWrite<T>& to, int row, int head, int i,
                                                float x1, float x2) {
    const int half = to.head_dim / 2;
    const long long position = to.positions[row];
    if (head < to.q_heads) {
        T* dst = to.q_out + (static_cast<long long>(row) * to.q_heads + head) * to.head_dim;
        rotate_pair(dst + i, dst + i + half, x1, x2, i, half, to.cos, to.sin, position,
                    to.max_positions);
        return;
    }
    const long long slot = to.slots[row];
    if (slot < 0 || slot >= to.num_blocks * to.block_size) return;
    const bool is_k = head < to.q_heads + to.kv_heads;
    const long long block_head =
        slot / to.block_size * to.kv_heads + (head - to.q_heads) % to.kv_heads;
    const int offset = static_cast<int>(slot % to.block_size);
    const auto at = [&](int d) {
        return is_k ? cache_at<VLLM, true>(block_head, offset, to.block_size, to.head_dim, d)
                    : cache_at<VLLM, false>(block_head, offset, to.block_size, to.head_dim, d);
    };
    if (is_k) {
        rotate_pair(to.k_cache + at(i), to.k_cache + at(i + half), x1, x2, i, half, to.cos,
                    to.sin, position, to.max_positions);
    } else {
        to.v_cache[at(i)] = float_to<T>(x1);
        to.v_cache[at(i + half)] = float_to<T>(x2);
    }
}

// A RoPE layer's decode-step QKV output into attention, one launch for three (RopeWrite's
// arguments after qkv's). qkv: [rows, (q_heads + 2 kv_heads) * head_dim] with a row stride of
// its own. Grid (rows, ceil((q_heads + 2 kv_heads) * head_dim / 2 / blockDim.x)): a thread per
// (head, pair).
template <typename T, bool VLLM>
__global__ void rope_write(const T* __restrict__ qkv, long long qkv_row_stride,
                           ROPE_WRITE_PARAMS) {
    const int half = head_dim / 2;
    const int pair = blockIdx.y * blockDim.x + threadIdx.x;
    if (pair >= (q_heads + 2 * kv_heads) * half) return;
    const int head = pair / half, i = pair % half;
    const T* src = qkv + blockIdx.x * qkv_row_stride + static_cast<long long>(head) * head_dim;
    rope_write_pair<T, VLLM>(ROPE_WRITE, blockIdx.x, head, i, to_float(src[i]),
                             to_float(src[i + half]));
}

// SwiGLU's product: out[row, i] = T(silu(gate[row, i])) * up[row, i], where gate_up [rows,
// 2 * n] holds gate then up in each row (one GEMM's output) and out is [rows, n]; n a multiple
// of VEC. Grid (rows, ceil(n / VEC / blockDim.x)). ahead, ahead_bytes: the cross-kernel
// prefetch, as rms_norm's (of W_down's first bytes).
template <typename T>
__global__ void silu_mul(T* __restrict__ out, const T* __restrict__ gate_up, int n,
                         const void* __restrict__ ahead, long long ahead_bytes) {
    if (threadIdx.x < 32)
        prefetch_share_l2(ahead, ahead_bytes, blockIdx.x * gridDim.y + blockIdx.y,
                          static_cast<long long>(gridDim.x) * gridDim.y, threadIdx.x);
    const int i = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) return;
    const size_t row = blockIdx.x;
    uint4 raw_g = *reinterpret_cast<const uint4*>(gate_up + row * 2 * n + i);
    uint4 raw_u = *reinterpret_cast<const uint4*>(gate_up + row * 2 * n + n + i);
    const T* g = reinterpret_cast<const T*>(&raw_g);
    const T* u = reinterpret_cast<const T*>(&raw_u);
    uint4 result;
    T* o = reinterpret_cast<T*>(&result);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        o[k] = float_to<T>(silu_times<T>(to_float(g[k]), to_float(u[k])));
    }
    *reinterpret_cast<uint4*>(out + row * n + i) = result;
}

// A linear layer over a few rows, the GEMV of decode at batch 1 or 2:
//   y[r, c] = T(sum_i x[r, i] * w[c, i] + bias[c])        (fp32 sums, one rounding, as cuBLAS)
// for r < ROWS, c < n, and what is written is EPILOGUE's:
//   LINEAR_PLAIN     out[r, c] = y[r, c]                    out [ROWS, n]
//   LINEAR_RESIDUAL  out[r, c] = T(y[r, c] + residual[r, c]) out, residual [ROWS, n] (a layer's
//                    last linear and its residual add, as torch rounds `residual + linear(...)`)
//   LINEAR_SWIGLU    out[r, j] = T(T(silu(y[r, j])) * y[r, j + n / 2])   out [ROWS, n / 2]: w
//                    stacks W_gate over W_up, and SwiGLU's product comes out of their GEMM as
//                    `silu_mul` rounds it; the CTA owns gate rows j.. and up rows n / 2 + j..
// or, in `linear_rope_write` (always with NORM: the attention norm, the QKV GEMM, RoPE and the
// cache write in one launch), y of a RoPE layer's fused QKV weight [(q_heads + 2 kv_heads) *
// head_dim, k] goes where `rope_write` puts it (RopeWrite), so that the QKV output never
// reaches memory: the CTA owns rows i.. and i + head_dim / 2.. of a head, the pairs RoPE rotates.
// w: [n, k] row-major (a torch Linear's weight), read once; x: [ROWS, k] with a row stride of
// its own; bias: [n] or null. k a multiple of VEC, rows of w and x 16-byte aligned.
// NORM: x is the RMSNorm's input h, and the linear takes weight * RMSNorm(h) (norm_weight [k],
// 16-byte aligned; norm_eps) without it ever reaching memory:
//   y[r, c] = T(rsqrt(mean(h[r]^2) + eps) * sum_i w[c, i] * norm_weight[i] * h[r, i] + bias[c])
// in fp32, without the two roundings of the normed x that rms_norm makes (so within T's
// precision of the two kernels, not equal to them bit for bit). Each CTA sums h's squares as it
// reads h for its products, so no CTA waits for the norm before its first loads.
// ahead, ahead_bytes, ahead_ctas: the cross-kernel L2 prefetch (off with ahead_bytes 0). The
// last ahead_ctas CTAs of the grid (the last wave: they start last) each bring an equal share of
// the first ahead_bytes at `ahead` (the next kernel's operand; 16-byte aligned, ahead_bytes a
// multiple of 16) into L2 once their own loads are used, so that the next kernel starts on L2
// hits while this grid drains. Nothing it computes changes.
// kv_*: the same for the K and V blocks of the attention after this kernel (off with kv_pairs
// 0): the last ahead_ctas CTAs share the first kv_pairs (K block, V block) pairs of the paged
// cache kv_k, kv_v under the block table kv_table [kv_rows, kv_table_cols] and the lengths
// kv_lens [kv_rows] (prefetch_paged_share_l2), in a warp of their own where the CTA has two.
//
// Such a layer only streams w from HBM, and the kernel's one job is to keep enough of w in
// flight on every SM, from the first CTA to the last. A CTA owns COLS rows of w and its warps
// split k between them (a warp per row alone would walk a long row, such as W_down's, one
// memory round trip after another); each lane issues COLS * UNROLL 16-byte loads before it uses
// any. The loads of w skip L1, where x stays for the next CTA. Many small CTAs let the block
// scheduler even out the SMs' shares. Each epilogue saves a launch of its own. Launched plainly,
// not as a programmatic dependent: the whole step runs slower so (docs/kernels/layer_ops.md).
// Grid ceil(n / COLS) (LINEAR_SWIGLU, linear_rope_write: ceil(n / 2 / (COLS / 2))); blockDim.x =
// 32 * warps, at most 32 * LINEAR_MAX_WARPS.
constexpr int LINEAR_MAX_WARPS = 8;
constexpr int LINEAR_PLAIN = 0, LINEAR_RESIDUAL = 1, LINEAR_SWIGLU = 2;

__device__ __forceinline__ uint4 load_once(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

template <typename T>
__device__ __forceinline__ float dot_vec(const uint4& a, const uint4& b, float acc) {
    const T* x = reinterpret_cast<const T*>(&a);
    const T* y = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc = fmaf(to_float(x[e]), to_float(y[e]), acc);
    return acc;
}

// A CTA's sums, a warp's share each: of y (linear_y adds them up) and, with NORM, of x's squares
template <int ROWS, int COLS>
struct LinearSums {
    float y[LINEAR_MAX_WARPS][ROWS][COLS];
    float squares[LINEAR_MAX_WARPS][ROWS];
};

// The dot product of a vector of w with VEC values of x in fp32
template <typename T>
__device__ __forceinline__ float dot_vec(const uint4& a, const float (&x)[VEC], float acc) {
    const T* w = reinterpret_cast<const T*>(&a);
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc = fmaf(to_float(w[e]), x[e], acc);
    return acc;
}

// A linear's cross-kernel prefetch (the ahead and kv_ahead arguments above)
struct LinearAhead {
    const void* bytes;
    long long num_bytes;
    int ctas;
    PagedBlocks kv;
    long long kv_pairs;
};

// linear_rope_write's weight rows in pairs: pair j is row i of head h = j / half (half =
// head_dim / 2, i = j % half) and row i + half of it, the two elements RoPE rotates together. A
// CTA owning COLS / 2 pairs from j0 takes the first rows as its columns c < COLS / 2 and the
// second as c + COLS / 2 (past the last pair, the last again): its column c's row.
template <int COLS>
__device__ __forceinline__ int rope_row(int j0, int c, int pairs, int half) {
    const int j = min(j0 + c % (COLS / 2), pairs - 1);
    return j / half * 2 * half + j % half + (c < COLS / 2 ? 0 : half);
}

// The CTA's sums for its weight rows weight_row(c) over x's ROWS rows (with NORM, of x times
// norm_weight, and of x's squares), each warp's share of k into `sums`; between the loads and the
// sums, the cross-kernel prefetch of the grid's last ahead.ctas CTAs.
template <typename T, int ROWS, int COLS, int UNROLL, bool NORM, typename WeightRow>
__device__ __forceinline__ void linear_sums(LinearSums<ROWS, COLS>& sums, WeightRow weight_row,
                                            const T* __restrict__ x, const T* __restrict__ w,
                                            const T* __restrict__ norm_weight, int k,
                                            long long x_row_stride, const LinearAhead& ahead) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int step = 32 * VEC * warps;  // elements of a row one CTA-wide load covers
    float acc[ROWS][COLS] = {};
    float squares[ROWS] = {};
    for (int base = threadIdx.x * VEC; base < k; base += step * UNROLL) {
        uint4 wv[COLS][UNROLL];
#pragma unroll
        for (int c = 0; c < COLS; ++c) {
            const T* row = w + static_cast<size_t>(weight_row(c)) * k;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (base + u * step < k) wv[c][u] = load_once(row + base + u * step);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (base + u * step >= k) break;
            uint4 gv;
            if (NORM) gv = *reinterpret_cast<const uint4*>(norm_weight + base + u * step);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                const uint4 xv = *reinterpret_cast<const uint4*>(x + r * x_row_stride + base + u * step);
                if (NORM) {
                    const T* h = reinterpret_cast<const T*>(&xv);
                    const T* g = reinterpret_cast<const T*>(&gv);
                    float xs[VEC];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const float value = to_float(h[e]);
                        squares[r] = fmaf(value, value, squares[r]);
                        xs[e] = value * to_float(g[e]);
                    }
#pragma unroll
                    for (int c = 0; c < COLS; ++c) acc[r][c] = dot_vec<T>(wv[c][u], xs, acc[r][c]);
                } else {
#pragma unroll
                    for (int c = 0; c < COLS; ++c) acc[r][c] = dot_vec<T>(wv[c][u], xv, acc[r][c]);
                }
            }
        }
    }
    // the last ahead.ctas CTAs: their own loads used, each its share of what comes next
    const long long tail_cta = static_cast<long long>(blockIdx.x) - (gridDim.x - ahead.ctas);
    if (warp == 0) prefetch_share_l2(ahead.bytes, ahead.num_bytes, tail_cta, ahead.ctas, lane);
    if (warp == (warps > 1 ? 1 : 0) && ahead.kv_pairs > 0)
        prefetch_paged_share_l2(ahead.kv, ahead.kv_pairs, tail_cta, ahead.ctas, lane);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < COLS; ++c) {
            for (int offset = 16; offset > 0; offset /= 2)
                acc[r][c] += __shfl_xor_sync(0xffffffffu, acc[r][c], offset);
            if (lane == 0) sums.y[warp][r][c] = acc[r][c];
        }
        if (NORM) {
            for (int offset = 16; offset > 0; offset /= 2)
                squares[r] += __shfl_xor_sync(0xffffffffu, squares[r], offset);
            if (lane == 0) sums.squares[warp][r] = squares[r];
        }
    }
    __syncthreads();
}

// y[r, c] of weight row `row`, the CTA's column c: the warps' sums (NORM: times x's
// rsqrt(mean(x^2) + eps)) and the bias, rounded to T
template <typename T, bool NORM, int ROWS, int COLS>
__device__ __forceinline__ float linear_y(const LinearSums<ROWS, COLS>& sums,
                                          const T* __restrict__ bias, int k, float norm_eps,
                                          int row, int r, int c) {
    const int warps = blockDim.x / 32;
    const float b = bias != nullptr ? to_float(bias[row]) : 0.0f;
    float total = NORM ? 0.0f : b;
    for (int i = 0; i < warps; ++i) total += sums.y[i][r][c];
    if (NORM) {
        float squares = 0.0f;
        for (int i = 0; i < warps; ++i) squares += sums.squares[i][r];
        total = total * rsqrtf(squares / k + norm_eps) + b;
    }
    return rounded<T>(total);
}

#define LINEAR_AHEAD_PARAMS                                                                      \
    const void *__restrict__ ahead, long long ahead_bytes, int ahead_ctas,                      \
        const void *__restrict__ kv_k, const void *__restrict__ kv_v,                           \
        const int *__restrict__ kv_table, const int *__restrict__ kv_lens, int kv_rows,          \
        int kv_table_cols, int kv_block_tokens, int kv_num_blocks, long long kv_block_bytes,    \
        long long kv_pairs
#define LINEAR_AHEAD                                                                             \
    LinearAhead {                                                                                \
        ahead, ahead_bytes, ahead_ctas,                                                          \
            PagedBlocks{static_cast<const char*>(kv_k), static_cast<const char*>(kv_v), kv_table, \
                        kv_lens, kv_rows, kv_table_cols, kv_block_tokens, kv_num_blocks,         \
                        kv_block_bytes},                                                         \
            kv_pairs                                                                             \
    }

template <typename T, int ROWS, int COLS, int UNROLL, int EPILOGUE, bool NORM>
__global__ void linear(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                       const T* __restrict__ bias, const T* __restrict__ residual, int n, int k,
                       long long x_row_stride, const T* __restrict__ norm_weight,
                       float norm_eps, LINEAR_AHEAD_PARAMS) {
    static_assert(EPILOGUE != LINEAR_SWIGLU || COLS % 2 == 0, "SwiGLU pairs gate and up rows");
    __shared__ LinearSums<ROWS, COLS> sums;
    // the CTA's weight rows: COLS from col0, or (SwiGLU) COLS / 2 gate rows from col0 and the
    // up rows n / 2 further
    const int col0 = blockIdx.x * (EPILOGUE == LINEAR_SWIGLU ? COLS / 2 : COLS);
    const auto weight_row = [&](int c) {
        if (EPILOGUE != LINEAR_SWIGLU) return min(col0 + c, n - 1);
        const int half = n / 2, j = min(col0 + c % (COLS / 2), half - 1);
        return c < COLS / 2 ? j : half + j;
    };
    linear_sums<T, ROWS, COLS, UNROLL, NORM>(sums, weight_row, x, w, norm_weight, k,
                                             x_row_stride, LINEAR_AHEAD);
    const auto y = [&](int r, int c) {
        return linear_y<T, NORM>(sums, bias, k, norm_eps, weight_row(c), r, c);
    };
    if (EPILOGUE == LINEAR_SWIGLU) {  // thread (r, c) writes out[r, col0 + c]
        const int half = n / 2;
        if (threadIdx.x < ROWS * COLS / 2) {
            const int r = threadIdx.x / (COLS / 2), c = threadIdx.x % (COLS / 2);
            if (col0 + c < half)
                out[static_cast<size_t>(r) * half + col0 + c] =
                    float_to<T>(silu_times<T>(y(r, c), y(r, c + COLS / 2)));
        }
    } else if (threadIdx.x < ROWS * COLS) {
        const int r = threadIdx.x / COLS, c = threadIdx.x % COLS;
        if (col0 + c < n) {
            const size_t at = static_cast<size_t>(r) * n + col0 + c;
            const float value = y(r, c);
            out[at] = float_to<T>(EPILOGUE == LINEAR_RESIDUAL ? value + to_float(residual[at])
                                                              : value);
        }
    }
}

template <typename T, int ROWS, int COLS, int UNROLL, bool VLLM>
__global__ void linear_rope_write(const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ bias, int k, long long x_row_stride,
                                  const T* __restrict__ norm_weight, float norm_eps,
                                  ROPE_WRITE_PARAMS, LINEAR_AHEAD_PARAMS) {
    static_assert(COLS % 2 == 0, "RoPE pairs the two halves of a head");
    __shared__ LinearSums<ROWS, COLS> sums;
    const int half = head_dim / 2, pairs = (q_heads + 2 * kv_heads) * half;
    const int j0 = blockIdx.x * (COLS / 2);  // the CTA's first pair
    const auto weight_row = [&](int c) { return rope_row<COLS>(j0, c, pairs, half); };
    linear_sums<T, ROWS, COLS, UNROLL, true>(sums, weight_row, x, w, norm_weight, k,
                                             x_row_stride, LINEAR_AHEAD);
    const auto y = [&](int r, int c) {
        return linear_y<T, true>(sums, bias, k, norm_eps, weight_row(c), r, c);
    };
    if (threadIdx.x < ROWS * COLS / 2) {  // thread (r, c): pair j0 + c of row r
        const int r = threadIdx.x / (COLS / 2), c = threadIdx.x % (COLS / 2), j = j0 + c;
        if (j < pairs)
            rope_write_pair<T, VLLM>(ROPE_WRITE, r, j / half, j % half, y(r, c),
                                     y(r, c + COLS / 2));
    }
}

#undef LINEAR_AHEAD
#undef LINEAR_AHEAD_PARAMS
#undef ROPE_WRITE
#undef ROPE_WRITE_PARAMS

// Greedy sampling's argmax over a decode step's logits, a CTA a row:
//   out[r] = the index of the largest x[r, c], c < cols: the first of equal ones, and NaN above
//   every number (torch.argmax's order).
// The logits stay in T (torch's path converts a step's [batch, vocab] logits to fp32 first, then
// runs a reduction with few outputs over them). Columns [0, vector_cols) are read in 16-byte vectors (x
// and the row stride 16-byte aligned, vector_cols a multiple of VEC; the launcher passes 0
// otherwise), ARGMAX_UNROLL of them in flight a thread; the rest one element at a time. A
// thread keeps its best vector, by the vector's maximum (NaN-propagating pairwise max, a few
// instructions for 8 elements), and looks inside it only once at the end. Each thread scans its
// columns in increasing order, so a strict comparison keeps the first of equal ones.
// blockDim.x a multiple of 32, at most 1024.
constexpr int ARGMAX_UNROLL = 4;

template <typename T> struct Pair;
template <> struct Pair<__half> { using type = __half2; };
template <> struct Pair<__nv_bfloat16> { using type = __nv_bfloat162; };

// whether value a at index i comes before b at index j in argmax's order
__device__ __forceinline__ bool argmax_before(float a, int i, float b, int j) {
    if (isnan(a) || isnan(b)) return isnan(a) && (!isnan(b) || i < j);
    return a > b || (a == b && i < j);
}

// the largest of a vector's VEC elements, NaN if any is NaN
template <typename T>
__device__ __forceinline__ float vector_max(const uint4& raw) {
    using P = typename Pair<T>::type;
    const P* p = reinterpret_cast<const P*>(&raw);
    const P m = __hmax2_nan(__hmax2_nan(p[0], p[1]), __hmax2_nan(p[2], p[3]));
    return to_float(__hmax_nan(m.x, m.y));
}

template <typename T>
__global__ void argmax(long long* __restrict__ out, const T* __restrict__ x, int cols,
                       int vector_cols, long long row_stride) {
    const T* row = x + blockIdx.x * row_stride;
    const uint4* vecs = reinterpret_cast<const uint4*>(row);
    const int vectors = vector_cols / VEC;
    float best = __int_as_float(0xff800000);  // -inf
    int at = 0x7fffffff;
    int best_vector = -1;  // this thread's vector holding `best`, whose element is found last
    for (int first = threadIdx.x; first < vectors; first += ARGMAX_UNROLL * blockDim.x) {
        uint4 raw[ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
            const int v = first + u * blockDim.x;
            if (v < vectors) raw[u] = __ldcs(vecs + v);
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
            const int v = first + u * blockDim.x;
            if (v >= vectors) break;
            const float m = vector_max<T>(raw[u]);
            if (best_vector < 0 || (isnan(m) ? !isnan(best) : m > best)) best = m, best_vector = v;
        }
    }
    if (best_vector >= 0) {  // the first element of the best vector that is its maximum
        const uint4 raw = vecs[best_vector];
        const T* e = reinterpret_cast<const T*>(&raw);
        for (int k = VEC - 1; k >= 0; --k) {
            const float value = to_float(e[k]);
            if (value == best || (isnan(value) && isnan(best))) at = best_vector * VEC + k;
        }
    }
    for (int c = vector_cols + threadIdx.x; c < cols; c += blockDim.x) {
        const float value = to_float(row[c]);
        if (argmax_before(value, c, best, at)) best = value, at = c;
    }
    // the CTA's winner: within each warp, then across the warps
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_at = __shfl_xor_sync(0xffffffffu, at, offset);
        if (argmax_before(other, other_at, best, at)) best = other, at = other_at;
    }
    __shared__ float warp_best[32];
    __shared__ int warp_at[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_best[warp] = best, warp_at[warp] = at;
    __syncthreads();
    if (warp == 0) {
        best = lane < blockDim.x / 32 ? warp_best[lane] : __int_as_float(0xff800000);
        at = lane < blockDim.x / 32 ? warp_at[lane] : 0x7fffffff;
        for (int offset = 16; offset > 0; offset /= 2) {
            const float other = __shfl_xor_sync(0xffffffffu, best, offset);
            const int other_at = __shfl_xor_sync(0xffffffffu, at, offset);
            if (argmax_before(other, other_at, best, at)) best = other, at = other_at;
        }
        if (lane == 0) out[blockIdx.x] = at;
    }
}

}  // namespace kvlab
