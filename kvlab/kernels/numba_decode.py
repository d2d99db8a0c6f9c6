"""Paged decode attention in Numba CUDA: one CTA per (query head, sequence), online softmax.

The same job as the CUDA C decode kernels, written in Python so it can be read, stepped through
in the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) and changed in a notebook. Layout "hnd":
k_cache, v_cache are [num_blocks, num_kv_heads, block_size, head_dim].

Grid (num_qo_heads, num_seqs), 128 threads (4 warps). The warps stride over the sequence's blocks
in rounds: in round r, warp w takes block r * 4 + w. Within a block, lane t computes the logit of
token t (the whole q.k dot product, q held in shared memory) and writes it to shared memory; after
a CTA barrier every lane folds the block into its warp's online softmax (running max, running sum
of exponentials) and accumulates p * v for its dimensions lane, lane + 32, ... At the end the 4
warps' (max, sum, acc) are merged through shared memory. Softmax and accumulation are fp32.
NOTE: only CTA barriers (`syncthreads`) are used, no warp shuffles, because the CUDA simulator has
none; every thread runs every round so the barriers are uniform.

With prefetch_distance > 0, a warp about to read block b first asks for block
b + prefetch_distance * 4 (the one it reads that many rounds later) to be brought into L2,
through the CUDA C device function in `kernels/prefetch_numba.cu` (bulk `cp.async.bulk.prefetch.L2`
on sm_90+, one `prefetch.global.L2` per 128-byte line before). In the simulator it is a no-op.

Supported: q, k_cache, v_cache float16 or float32 (q's dtype may differ from the cache's), out
float32 or q's dtype, head_dim and block_size in [1, 256], any GQA ratio.

It is latency-bound (one lane walks a whole head_dim per token; 2 barriers per round) and reads
far below the copy roofline: a readable reference, not a fast kernel.
"""

import functools
import math
import numbers

import numpy as np

# NOTE: numba-cuda 0.30.4 calls np.row_stack, which numpy 2.5 removed; restore it as its alias.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

import numba  # noqa: E402
from numba import cuda, float32, int32, uint32, uint64  # noqa: E402

from kvlab.arith import ceil_div
from kvlab.kernels.loader import source_dir  # noqa: E402
from kvlab.kernels.prefetch import MAX_DISTANCE  # noqa: E402

WARP_SIZE = 32
NUM_WARPS = 4
NUM_THREADS = NUM_WARPS * WARP_SIZE
MAX_HEAD_DIM = 256
MAX_BLOCK_SIZE = 256
MAX_NUM_SEQS = 65535  # gridDim.y
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32))
FP32_MAX = float(np.finfo(np.float32).max)  # the kernel scales q in float32

SIMULATED = bool(numba.config.ENABLE_CUDASIM)

if SIMULATED:
    # The simulator cannot link CUDA C: prefetching is a no-op there (the call still runs).
    _JIT_OPTIONS = {}

    @cuda.jit(device=True)
    def prefetch_l2(addr, num_bytes, lane):
        return 0

else:
    _JIT_OPTIONS = {"link": [str(source_dir() / "prefetch_numba.cu")]}
    # int kvlab_prefetch_l2(int* return_value, unsigned long long addr, unsigned bytes, int lane)
    prefetch_l2 = cuda.declare_device("kvlab_prefetch_l2", "int32(uint64, uint32, int32)")


@cuda.jit(device=True)
def scale_q(q_scaled, q, seq, head, scale, tid):
    """q_scaled[d] = q[seq, head, d] * scale in fp32, the CTA's threads striding over d."""
    for d in range(tid, q_scaled.shape[0], NUM_THREADS):
        q_scaled[d] = float32(q[seq, head, d]) * scale


@cuda.jit(device=True)
def prefetch_block(block_tables, seq, b, kv_head, num_kv_heads, k_addr, v_addr, tile_bytes,
                   lane):
    """Ask for the K and V tiles of the sequence's block b (its kv_head's) to come into L2."""
    offset = (block_tables[seq, b] * num_kv_heads + kv_head) * tile_bytes
    prefetch_l2(uint64(k_addr + offset), uint32(tile_bytes), int32(lane))
    prefetch_l2(uint64(v_addr + offset), uint32(tile_bytes), int32(lane))


@cuda.jit(device=True)
def qk_logits(logits, warp, lane, q_scaled, k_cache, block_id, kv_head, num_tokens):
    """logits[warp, t] = q_scaled . k[t] for the block's num_tokens tokens: lane t takes token
    t (and t + 32, ...), the whole dot product over head_dim."""
    for t in range(lane, num_tokens, WARP_SIZE):
        s = float32(0.0)
        for d in range(q_scaled.shape[0]):
            s += q_scaled[d] * float32(k_cache[block_id, kv_head, t, d])
        logits[warp, t] = s


@cuda.jit(device=True)
def softmax_rescale(logits, warp, num_tokens, run_max, run_sum, acc):
    """The warp's online softmax meets a block: the running max over its logits too, and
    run_sum and acc rescaled by exp(old max - new max) (0 on the first block, old max -inf).
    Returns (new max, rescaled run_sum); acc is rescaled in place."""
    new_max = run_max
    for t in range(num_tokens):
        new_max = max(new_max, logits[warp, t])
    alpha = math.exp(run_max - new_max)
    run_sum *= alpha
    for i in range(acc.shape[0]):
        acc[i] *= alpha
    return new_max, run_sum


@cuda.jit(device=True)
def weights_times_v(logits, warp, lane, v_cache, block_id, kv_head, num_tokens, run_max,
                    run_sum, acc):
    """acc[i] += p_t * v[t, d] for the block's tokens and this lane's d = lane + 32 i, with
    p_t = exp(logits[warp, t] - run_max); returns run_sum + the p_t."""
    head_dim = v_cache.shape[3]
    for t in range(num_tokens):
        p = math.exp(logits[warp, t] - run_max)
        run_sum += p
        for i in range(acc.shape[0]):
            d = lane + i * WARP_SIZE
            if d < head_dim:
                acc[i] += p * float32(v_cache[block_id, kv_head, t, d])
    return run_sum


@cuda.jit(device=True)
def merge_warps(out, seq, head, tid, run_max, run_sum, acc, warp_max, warp_sum, warp_acc):
    """out[seq, head] from the warps' (run_max, run_sum, acc), through shared memory:
    sum_w c_w acc_w / sum_w c_w run_sum_w, c_w = e^(run_max_w - M), M = max_w run_max_w."""
    warp, lane = tid // WARP_SIZE, tid % WARP_SIZE
    head_dim = warp_acc.shape[1]
    if lane == 0:
        warp_max[warp] = run_max
        warp_sum[warp] = run_sum
    for i in range(acc.shape[0]):
        d = lane + i * WARP_SIZE
        if d < head_dim:
            warp_acc[warp, d] = acc[i]
    cuda.syncthreads()
    m_all = warp_max[0]
    for w in range(1, NUM_WARPS):
        m_all = max(m_all, warp_max[w])
    for d in range(tid, head_dim, NUM_THREADS):
        total = float32(0.0)
        denom = float32(0.0)
        if m_all > -math.inf:  # NOTE: m_all = -inf only for seq_len <= 0; that row gets zeros
            for w in range(NUM_WARPS):
                c = math.exp(warp_max[w] - m_all)  # 0 for a warp that saw no block
                total += c * warp_acc[w, d]
                denom += c * warp_sum[w]
            total /= denom
        out[seq, head, d] = total


@functools.cache
def _kernel(head_dim: int, block_size: int):
    """The kernel for one (head_dim, block_size); Numba compiles it on first launch, per dtype.
    Its phases are the device functions above: scale_q, then per round of blocks (prefetch_block,)
    qk_logits, softmax_rescale and weights_times_v, then merge_warps."""
    dims_per_lane = ceil_div(head_dim, WARP_SIZE)

    @cuda.jit(**_JIT_OPTIONS)
    def decode_kernel(out, q, k_cache, v_cache, block_tables, seq_lens, scale, prefetch_distance,
                      k_addr, v_addr, tile_bytes):
        # out, q: [num_seqs, num_qo_heads, head_dim]
        # k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim]
        # block_tables: [num_seqs, max_num_blocks] int32; seq_lens: [num_seqs] int32
        head, seq, tid = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x
        warp, lane = tid // WARP_SIZE, tid % WARP_SIZE
        num_kv_heads = k_cache.shape[1]
        kv_head = head // (q.shape[1] // num_kv_heads)
        seq_len = seq_lens[seq]
        num_seq_blocks = (seq_len + block_size - 1) // block_size

        q_scaled = cuda.shared.array(head_dim, float32)
        logits = cuda.shared.array((NUM_WARPS, block_size), float32)
        scale_q(q_scaled, q, seq, head, scale, tid)
        cuda.syncthreads()

        # This warp's online softmax: the running max of its logits, the running sum of
        # exp(logit - run_max), and acc[i], the running sum of exp(logit - run_max) * v[d] for this
        # lane's d = lane + 32 i.
        run_max = float32(-math.inf)
        run_sum = float32(0.0)
        acc = cuda.local.array(dims_per_lane, float32)
        for i in range(dims_per_lane):
            acc[i] = float32(0.0)

        num_rounds = (num_seq_blocks + NUM_WARPS - 1) // NUM_WARPS
        for r in range(num_rounds):
            b = r * NUM_WARPS + warp
            num_tokens = min(block_size, seq_len - b * block_size)  # <= 0: no block for this warp
            block_id = 0
            if num_tokens > 0:
                block_id = block_tables[seq, b]
                ahead = b + prefetch_distance * NUM_WARPS
                if prefetch_distance > 0 and ahead < num_seq_blocks:
                    prefetch_block(block_tables, seq, ahead, kv_head, num_kv_heads, k_addr,
                                   v_addr, tile_bytes, lane)
                qk_logits(logits, warp, lane, q_scaled, k_cache, block_id, kv_head, num_tokens)
            cuda.syncthreads()
            if num_tokens > 0:
                new_max, run_sum = softmax_rescale(logits, warp, num_tokens, run_max, run_sum, acc)
                run_sum = weights_times_v(logits, warp, lane, v_cache, block_id, kv_head,
                                          num_tokens, new_max, run_sum, acc)
                run_max = new_max
            cuda.syncthreads()  # the logits are overwritten next round

        warp_max = cuda.shared.array(NUM_WARPS, float32)
        warp_sum = cuda.shared.array(NUM_WARPS, float32)
        warp_acc = cuda.shared.array((NUM_WARPS, head_dim), float32)
        merge_warps(out, seq, head, tid, run_max, run_sum, acc, warp_max, warp_sum, warp_acc)

    return decode_kernel


def decode_attention_numba(
    q, k_cache, v_cache, block_tables, seq_lens, scale=None, prefetch_distance=0, out=None
):
    """One decode step of paged attention, with the Numba CUDA kernel.

    All arrays are either numpy arrays (copied to the GPU and back) or CUDA arrays (Numba device
    arrays, or anything with `__cuda_array_interface__`, e.g. torch CUDA tensors), C-contiguous.

    Args:
        q: [num_seqs, num_qo_heads, head_dim], float16 or float32. 1 <= num_seqs <= 65535.
        k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim] ("hnd"), float16 or
            float32, same shape and dtype. 1 <= head_dim <= 256, 1 <= block_size <= 256.
            Query head h reads KV head h // (num_qo_heads // num_kv_heads).
        block_tables: [num_seqs, max_num_blocks] int32, block ids; entries past a sequence's
            last block are ignored (pad them with 0).
        seq_lens: [num_seqs] int32, each in [1, max_num_blocks * block_size].
        scale: softmax scale, default 1 / sqrt(head_dim); a finite number float32 holds.
        prefetch_distance: 0 for none; d in [1, 16] prefetches into L2 the block each warp
            reads d rounds (4 blocks per round) later.
        out: optional [num_seqs, num_qo_heads, head_dim], float32 or q's dtype, same kind of
            array as the inputs; written in place and returned.
    Returns:
        out, or a new float32 array: numpy for numpy inputs, else a Numba device array (on
        Numba's default stream, not synchronized).
    Raises:
        ValueError for a wrong type, shape, dtype, contiguity, or mix of host and CUDA arrays;
        for numpy inputs also for seq_lens or block ids out of range (not checked on the GPU).
    """
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": block_tables,
             "seq_lens": seq_lens}
    if out is not None:
        named["out"] = out
    on_device = _check_kinds(named)
    arrays = {name: _as_array(value, on_device) for name, value in named.items()}
    _check_shapes(arrays)
    num_seqs, num_qo_heads, head_dim = arrays["q"].shape
    scale = _check_scale(scale, head_dim)
    prefetch_distance = _check_prefetch_distance(prefetch_distance)
    tile_bytes = _check_tile_bytes(arrays["k_cache"], prefetch_distance)
    if on_device:
        device = arrays
    else:
        _check_host_values(arrays["block_tables"], arrays["seq_lens"],
                           arrays["k_cache"].shape[0], arrays["k_cache"].shape[2])
        device = {name: cuda.to_device(a) for name, a in arrays.items() if name != "out"}
    out_d = device.get("out")
    if out_d is None:
        out_dtype = arrays["out"].dtype if out is not None else np.float32
        out_d = cuda.device_array((num_seqs, num_qo_heads, head_dim), out_dtype)
    _launch(out_d, device, scale, prefetch_distance, tile_bytes)
    if on_device:
        return out if out is not None else out_d
    return out_d.copy_to_host(out)


def _check_tile_bytes(k_cache, prefetch_distance: int) -> int:
    """The bytes of one (block, KV head) tile; ValueError where prefetching needs them a multiple
    of 16."""
    _, _, block_size, head_dim = k_cache.shape
    tile_bytes = block_size * head_dim * k_cache.dtype.itemsize
    if prefetch_distance and tile_bytes % 16:
        raise ValueError(
            f"prefetch_distance={prefetch_distance}: needs block_size * head_dim * itemsize "
            f"= {tile_bytes} to be a multiple of 16 bytes; use prefetch_distance=0"
        )
    return tile_bytes


def _launch(out, device: dict, scale: float, prefetch_distance: int, tile_bytes: int) -> None:
    """Launch the kernel on the device arrays, grid (num_qo_heads, num_seqs) of NUM_THREADS
    threads, once the caches' addresses suit prefetching (16-byte aligned)."""
    num_seqs, num_qo_heads, head_dim = device["q"].shape
    k_cache = device["k_cache"]
    block_size = k_cache.shape[2]
    k_addr, v_addr = _data_address(k_cache), _data_address(device["v_cache"])
    if prefetch_distance and (k_addr % 16 or v_addr % 16):
        raise ValueError(
            f"prefetch_distance={prefetch_distance}: k_cache and v_cache must start 16-byte "
            f"aligned, got addresses {k_addr:#x}, {v_addr:#x}; use prefetch_distance=0"
        )
    kernel = _kernel(head_dim, block_size)
    kernel[(num_qo_heads, num_seqs), NUM_THREADS](
        out, device["q"], k_cache, device["v_cache"], device["block_tables"],
        device["seq_lens"], np.float32(scale), np.int32(prefetch_distance), np.int64(k_addr),
        np.int64(v_addr), np.int64(tile_bytes),
    )


def _check_kinds(named: dict) -> bool:
    """True if every array is a CUDA array, False if every one is a numpy array."""
    kinds = {}
    for name, value in named.items():
        if isinstance(value, np.ndarray):
            kinds[name] = "numpy"
        elif getattr(value, "__cuda_ndarray__", False) or hasattr(
            value, "__cuda_array_interface__"
        ):
            kinds[name] = "cuda"
        else:
            raise ValueError(
                f"{name}: must be a numpy.ndarray or a CUDA array (Numba device array, torch CUDA "
                f"tensor), got {type(value).__name__}"
            )
    if len(set(kinds.values())) > 1:
        raise ValueError(f"arrays: must be all numpy arrays or all CUDA arrays, got {kinds}")
    return "cuda" in kinds.values()


def _as_array(value, on_device: bool):
    """A numpy array, or a Numba device array (a view, no copy) of a CUDA array."""
    if not on_device or getattr(value, "__cuda_ndarray__", False):
        return value
    return cuda.as_cuda_array(value)


def _check_shapes(arrays: dict) -> None:
    q, k_cache, v_cache = arrays["q"], arrays["k_cache"], arrays["v_cache"]
    for name, array in arrays.items():
        if not _is_c_contiguous(array):
            raise ValueError(f"{name}: must be C-contiguous (strides {array.strides})")
    if q.ndim != 3:
        raise ValueError(f"q.shape={q.shape}: must be [num_seqs, num_qo_heads, head_dim]")
    if k_cache.ndim != 4:
        raise ValueError(
            f"k_cache.shape={k_cache.shape}: must be [num_blocks, num_kv_heads, block_size, "
            f"head_dim] (layout 'hnd')"
        )
    for name in ("q", "k_cache"):
        if arrays[name].dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}.dtype={arrays[name].dtype}: must be float16 or float32")
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"v_cache: shape {v_cache.shape}, dtype {v_cache.dtype}: must equal k_cache's "
            f"{k_cache.shape}, {k_cache.dtype}"
        )
    num_seqs, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, block_size, kv_head_dim = k_cache.shape
    if not 1 <= num_seqs <= MAX_NUM_SEQS:
        raise ValueError(f"num_seqs={num_seqs} (q.shape[0]): must be in [1, {MAX_NUM_SEQS}]")
    if kv_head_dim != head_dim:
        raise ValueError(f"q.shape[2]={head_dim}: must equal k_cache's head_dim={kv_head_dim}")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim={head_dim}: must be in [1, {MAX_HEAD_DIM}]")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise ValueError(f"block_size={block_size}: must be in [1, {MAX_BLOCK_SIZE}]")
    if num_kv_heads < 1 or num_qo_heads < 1 or num_qo_heads % num_kv_heads:
        raise ValueError(
            f"num_qo_heads={num_qo_heads}: must be a multiple of num_kv_heads={num_kv_heads} "
            "and positive"
        )
    block_tables, seq_lens = arrays["block_tables"], arrays["seq_lens"]
    if block_tables.ndim != 2 or block_tables.shape[0] != num_seqs or block_tables.shape[1] < 1:
        raise ValueError(
            f"block_tables.shape={block_tables.shape}: must be [num_seqs={num_seqs}, "
            f"max_num_blocks >= 1]"
        )
    if seq_lens.shape != (num_seqs,):
        raise ValueError(f"seq_lens.shape={seq_lens.shape}: must be [num_seqs={num_seqs}]")
    for name in ("block_tables", "seq_lens"):
        if arrays[name].dtype != np.int32:
            raise ValueError(f"{name}.dtype={arrays[name].dtype}: must be int32")
    out = arrays.get("out")
    if out is not None and (out.shape != q.shape or out.dtype not in (np.float32, q.dtype)):
        raise ValueError(
            f"out: shape {out.shape}, dtype {out.dtype}: must be q's shape {q.shape}, "
            f"dtype float32 or q's {q.dtype}"
        )


def _check_host_values(
    block_tables: np.ndarray, seq_lens: np.ndarray, num_blocks: int, block_size: int
) -> None:
    max_len = block_tables.shape[1] * block_size
    bad = np.flatnonzero((seq_lens < 1) | (seq_lens > max_len))
    if bad.size:
        i = bad[0]
        raise ValueError(
            f"seq_lens[{i}]={seq_lens[i]}: must be in [1, max_num_blocks * block_size = {max_len}]"
        )
    bad = np.argwhere((block_tables < 0) | (block_tables >= num_blocks))
    if bad.size:
        i, j = bad[0]
        raise ValueError(
            f"block_tables[{i}, {j}]={block_tables[i, j]}: must be a block id in [0, {num_blocks})"
        )


def _check_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not abs(scale) <= FP32_MAX:
        raise ValueError(f"scale={scale!r}: must be a finite number of magnitude at most "
                         f"{FP32_MAX:.4g} (float32), or None")
    return float(scale)


def _check_prefetch_distance(prefetch_distance) -> int:
    if (
        isinstance(prefetch_distance, bool)
        or not isinstance(prefetch_distance, int | np.integer)
        or not 0 <= prefetch_distance <= MAX_DISTANCE
    ):
        raise ValueError(
            f"prefetch_distance={prefetch_distance!r}: must be an integer in [0, {MAX_DISTANCE}]"
        )
    return int(prefetch_distance)


def _is_c_contiguous(array) -> bool:
    if isinstance(array, np.ndarray):
        return array.flags.c_contiguous
    return array.is_c_contiguous()


def _data_address(array) -> int:
    """The device address of a CUDA array's first element (0 in the simulator: no prefetch)."""
    if SIMULATED:
        return 0
    return array.__cuda_array_interface__["data"][0]
