"""A paged cache filled with random K/V, as the benchmarks and the profiler read it."""

import itertools

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.cache.fp8 import FP8_DTYPE
from kvlab.cache.paged_cache import PagedKVCache
from kvlab.checks import check_block_size, check_positive_int, is_int

_FP8_CHUNK = 1 << 26  # elements drawn at a time for an fp8 cache (fp16 first: 128 MiB)


def filled_cache(num_seqs: int, context, block_size: int, num_kv_heads: int, head_dim: int,
                 *, layout: str, dtype, device="cuda", sibling: int | None = None,
                 in_order: bool = False):
    """A cache holding `num_seqs` sequences of `context` tokens of random K/V (normal), their
    blocks scattered over the pool, as in a server that has run for a while, or with `in_order`
    handed out in id order, as from a fresh pool (each sequence's blocks one run of ids, the
    sequences one after another): (cache, seq_ids, sibling_ids). `context`: an int, or the
    num_seqs lengths of a batch of mixed lengths (ints >= 1). With `sibling`, each sequence
    has token ids and a sibling sequence of its first `sibling` tokens (whole blocks, fewer than
    `context`) shares its blocks (no new memory; sibling_ids is empty otherwise). An fp8 cache
    (dtype=torch.float8_e4m3fn) holds normal values drawn in fp16 and rounded, with its scales
    left at 1.0 (the values are in e4m3's range). Raises ValueError for a bad argument, and
    for a cache that does not fit on `device` before allocating it."""
    check_positive_int("num_seqs", num_seqs)
    check_block_size(block_size)
    lengths = _lengths(num_seqs, context)  # None: one context for all
    if sibling is not None and (not is_int(sibling) or lengths is not None
                                or not 0 < sibling < context or sibling % block_size):
        raise ValueError(f"sibling={sibling!r}: must be a multiple of block_size={block_size} "
                         f"in [1, context={context}) (one context for all)")
    num_blocks = (num_seqs * ceil_div(int(context), block_size) if lengths is None
                  else sum(ceil_div(n, block_size) for n in lengths))
    cache = PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype,
                         device=device, layout=layout, seed=None if in_order else 0)
    for t in (cache.k_cache, cache.v_cache):
        if t.dtype == FP8_DTYPE:  # normal_ has no float8 kernel: draw in fp16 and round
            flat = t.view(-1)
            for start in range(0, flat.numel(), _FP8_CHUNK):
                part = flat[start:start + _FP8_CHUNK]
                part.copy_(torch.randn(part.numel(), dtype=torch.float16, device=t.device))
        else:
            t.normal_()
    # NOTE: the data is random either way, so sequences are placed without writing K/V again.
    seq_ids, sibling_ids = [], []
    for i, n in enumerate(lengths or itertools.repeat(int(context), num_seqs)):
        ids = range(i * n, (i + 1) * n) if sibling else None
        seq_ids.append(cache.manager.add_sequence(n, ids).seq_id)
        if sibling:
            sibling_ids.append(cache.manager.add_sequence(int(sibling), ids[:sibling]).seq_id)
    return cache, seq_ids, sibling_ids


def _lengths(num_seqs: int, context) -> list[int] | None:
    """The num_seqs lengths of a batch of mixed lengths, or None for one context for all;
    ValueError unless `context` is an int >= 1 or num_seqs ints >= 1."""
    if is_int(context) and context >= 1:
        return None
    lengths = list(context) if isinstance(context, (list, tuple, np.ndarray)) else None
    if lengths is None or len(lengths) != num_seqs or not all(
            is_int(n) and n >= 1 for n in lengths):
        raise ValueError(f"context={context!r}: must be an int >= 1 or {num_seqs} ints >= 1")
    return [int(n) for n in lengths]
