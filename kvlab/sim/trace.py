"""The address streams of the decode kernel families, in the order the L2 sees them.

A trace is a sequence of requests (byte address, bytes, kind of kvlab.sim.l2.KINDS, time): one
per contiguous K or V range a warp loads, and one per range it prefetches, each at the time of its
CTA iteration (kvlab.sim.spec: its round plus its CTA's phase), in time order.

- vllm_v1 (kernels/paged_decode_vllm.cu): one CTA per (query head, sequence, partition), launch
  order head fastest. Warp w loads the whole (block, KV head) tile of blocks w, w + 4, ... of the
  CTA's range, each followed by the prefetch of the tile NUM_WARPS * distance blocks ahead (if in
  the range); the K loop over all blocks, then the V loop.
- gqa (kernels/paged_decode_gqa.cu, "hnd" layout): one CTA per (partition, KV head, sequence),
  partition fastest. Per tile (16 tokens a warp: 64 or, with 8 warps, 128), warp w loads K and V
  of rows [16w, 16w + 16) (not past the sequence), then prefetches its runs of the tile
  `distance` tiles ahead.

The CTAs' iterations come in the order of kvlab.sim.spec.timed_schedule.
Within an iteration the order is warp 0's requests, warp 1's, ...; the K and V copies of a gqa
tile, interleaved per instruction in the kernel, come K range then V range (no reuse between them).

Memory: the schedule holds two int64 and one float64 per CTA iteration (TraceSpec bounds it by
MAX_TRACE_BYTES); requests come in chunks, each within MAX_TRACE_BYTES too.
"""

import numba
import numpy as np

from kvlab.arith import ceil_div
from kvlab.checks import check_int
from kvlab.kernels.geometry import GQA_WARP_TOKENS
from kvlab.kernels.geometry import VLLM_NUM_WARPS as NUM_WARPS
from kvlab.sim.l2 import DEMAND, PREFETCH, PREFETCH_LINES
from kvlab.sim.spec import (
    MAX_TRACE_BYTES,
    TraceSpec,
    block_tables,
    check_spec,
    timed_schedule,
)

# Most requests per CTA iteration and warp: vllm a load + a prefetch; gqa K + V of 2 blocks, x 2.
_MAX_REQUESTS = {"vllm_v1": 2, "gqa": 8}
_REQUEST_BYTES = 25  # int64 address and size, uint8 kind, float64 time
_MAX_WARPS = 8
# the most CTA iterations whose request buffers fit MAX_TRACE_BYTES, at any shape
MAX_CHUNK_ITERATIONS = MAX_TRACE_BYTES // (_REQUEST_BYTES * max(_MAX_REQUESTS.values())
                                           * _MAX_WARPS)


def iter_requests(spec: TraceSpec, chunk_iterations: int = 1 << 16):
    """An iterator of (addrs, nbytes, kinds, times) chunks of the trace, each [n] int64 / int64 /
    uint8 / float64 (rounds, nondecreasing), for chunk_iterations CTA iterations at a time
    (bounded memory for any shape). Raises ValueError at once for a spec that is not a TraceSpec
    or chunk_iterations not in [1, MAX_CHUNK_ITERATIONS]."""
    check_spec(spec)
    check_int("chunk_iterations", chunk_iterations, 1, MAX_CHUNK_ITERATIONS)
    return _chunks(spec, int(chunk_iterations))


def _chunks(spec: TraceSpec, chunk_iterations: int):
    tables = block_tables(spec)
    cta_ids, iterations, times = timed_schedule(spec)
    pf = spec.prefetch
    pf_kind = PREFETCH_LINES if pf.mode == "line" else PREFETCH
    pf_k, pf_v = pf.enabled and pf.k, pf.enabled and pf.v
    for first in range(0, cta_ids.size, chunk_iterations):
        chunk = slice(first, min(first + chunk_iterations, cta_ids.size))
        n = (chunk.stop - chunk.start) * _MAX_REQUESTS[spec.family] * spec.warps
        out = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.uint8),
               np.empty(n, np.float64))
        if spec.family == "vllm_v1":
            n = _vllm_requests(
                cta_ids[chunk], iterations[chunk], times[chunk], tables, spec.context,
                spec.num_qo_heads, spec.num_qo_heads // spec.num_kv_heads, spec.num_kv_heads,
                spec.block_size, ceil_div(spec.cta_tokens, spec.block_size), spec.tile_bytes,
                spec.v_base, pf_kind, pf_k, pf_v, pf.distance * NUM_WARPS, out)
        else:
            n = _gqa_requests(
                cta_ids[chunk], iterations[chunk], times[chunk], tables, spec.context,
                spec.num_kv_heads, spec.num_partitions, spec.cta_tokens, spec.block_size,
                spec.head_dim * spec.dtype_bytes, spec.v_base, pf_kind, pf_k, pf_v,
                pf.distance, spec.warps, out)
        yield tuple(a[:n] for a in out)


def requests(spec: TraceSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The whole trace as one (addrs, nbytes, kinds, times) tuple: for small shapes and tests.
    Raises ValueError for a spec whose requests could take more than MAX_TRACE_BYTES (iterate
    over `iter_requests` instead)."""
    check_spec(spec)
    nbytes = spec.num_iterations * _MAX_REQUESTS[spec.family] * spec.warps * _REQUEST_BYTES
    if 2 * nbytes > MAX_TRACE_BYTES:  # the chunks and their concatenation
        raise ValueError(f"num_seqs={spec.num_seqs}, context={spec.context}: the whole trace "
                         f"could take {2 * nbytes / 2**20:,.0f} MiB, more than MAX_TRACE_BYTES "
                         f"= {MAX_TRACE_BYTES // 2**20} MiB: iterate over iter_requests(spec)")
    return tuple(np.concatenate(parts) for parts in zip(*iter_requests(spec), strict=True))


@numba.njit(cache=True)
def _put(out, n, addr, size, kind, time):
    """Writes request n into the (addrs, nbytes, kinds, times) arrays `out`; returns n + 1."""
    out[0][n], out[1][n], out[2][n], out[3][n] = addr, size, kind, time
    return n + 1


@numba.njit(cache=True)
def _vllm_requests(cta_ids, iterations, times, tables, seq_len, num_qo_heads, group,
                   num_kv_heads, block_size, part_blocks, tile_bytes, v_base, pf_kind, pf_k, pf_v,
                   pf_ahead, out):
    n, num_seqs = 0, tables.shape[0]
    end_all = (seq_len + block_size - 1) // block_size
    for i in range(cta_ids.size):
        head, rest = cta_ids[i] % num_qo_heads, cta_ids[i] // num_qo_heads
        seq, partition = rest % num_seqs, rest // num_seqs
        start = partition * part_blocks
        end = min(start + part_blocks, end_all)
        iters = (end - start + NUM_WARPS - 1) // NUM_WARPS
        base, prefetch = (v_base, pf_v) if iterations[i] >= iters else (0, pf_k)
        first = start + (iterations[i] % iters) * NUM_WARPS
        for block in range(first, min(first + NUM_WARPS, end)):  # warp w: block first + w
            tile = (tables[seq, block] * num_kv_heads + head // group) * tile_bytes
            n = _put(out, n, base + tile, tile_bytes, DEMAND, times[i])
            if prefetch and block + pf_ahead < end:
                tile = (tables[seq, block + pf_ahead] * num_kv_heads + head // group) * tile_bytes
                n = _put(out, n, base + tile, tile_bytes, pf_kind, times[i])
    return n


@numba.njit(cache=True)
def _gqa_requests(cta_ids, iterations, times, tables, seq_len, num_kv_heads, num_partitions,
                  cta_tokens, block_size, row_bytes, v_base, pf_kind, pf_k, pf_v,
                  pf_distance, num_warps, out):
    tile_tokens = num_warps * GQA_WARP_TOKENS
    n, run = 0, min(block_size, tile_tokens)  # run: tokens of one prefetch call
    for i in range(cta_ids.size):
        partition, rest = cta_ids[i] % num_partitions, cta_ids[i] // num_partitions
        kv_head, seq = rest % num_kv_heads, rest // num_kv_heads
        start = partition * cta_tokens
        end = min(start + cta_tokens, seq_len)
        num_tiles = (end - start + tile_tokens - 1) // tile_tokens
        tile = iterations[i]
        for warp in range(num_warps):
            row0 = start + tile * tile_tokens + warp * GQA_WARP_TOKENS
            row, stop = row0, min(row0 + GQA_WARP_TOKENS, end)
            while row < stop:  # this warp's rows, one run per block
                run_end = min((row // block_size + 1) * block_size, stop)
                offset = _row_offset(tables[seq, row // block_size], num_kv_heads, kv_head,
                                     block_size, row, row_bytes)
                size = (run_end - row) * row_bytes
                n = _put(out, n, offset, size, DEMAND, times[i])
                n = _put(out, n, v_base + offset, size, DEMAND, times[i])
                row = run_end
            if not (pf_k or pf_v) or tile + pf_distance >= num_tiles:
                continue
            if run > GQA_WARP_TOKENS and (warp * GQA_WARP_TOKENS) % run:
                continue  # the warp whose rows start the run issues it
            ahead = row0 + pf_distance * tile_tokens
            for run0 in range(ahead, ahead + max(run, GQA_WARP_TOKENS), run):
                if run0 >= end:
                    break
                size = min(run, end - run0) * row_bytes
                offset = _row_offset(tables[seq, run0 // block_size], num_kv_heads, kv_head,
                                     block_size, run0, row_bytes)
                if pf_k:
                    n = _put(out, n, offset, size, pf_kind, times[i])
                if pf_v:
                    n = _put(out, n, v_base + offset, size, pf_kind, times[i])
    return n


@numba.njit(cache=True)
def _row_offset(block_id, num_kv_heads, kv_head, block_size, token, row_bytes):
    """Byte offset of `token`'s row in [num_blocks, num_kv_heads, block_size, head_dim]."""
    return ((block_id * num_kv_heads + kv_head) * block_size + token % block_size) * row_bytes
