"""Memory accounting: a paged KV cache against contiguous preallocation, for one workload.

Every request is counted at its final length `seq_len = prompt_len + output_len`.

Paged, block size `bs`: request i holds `ceil(seq_len / bs)` blocks. A shared prefix of `p`
tokens covers `p // bs` full blocks, which prefix caching stores once per prefix group; the block
where the prefix ends also holds the request's own tokens, so it stays private. This is the exact
count `BlockManager` allocates when each request is added with its token ids.

Contiguous: each request reserves `max_seq_len` token slots up front and keeps its own copy of
any shared prefix.

All arithmetic is vectorised over requests and block sizes: a 1000-request sweep over nine block
sizes is a few [9, 1000] integer arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.arith import ceil_div
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import as_list
from kvlab.checks import check_block_size, check_positive_int, is_real
from kvlab.workload import Workload

__all__ = [
    "BLOCK_SIZES",
    "CacheUsage",
    "FragmentationSweep",
    "MemoryReport",
    "fragmentation_sweep",
    "memory_report",
    "replay_block_tables",
]

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
INT64_MAX = int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class CacheUsage:
    """KV memory of one caching scheme holding a whole workload.

    reserved_bytes: bytes set aside (whole blocks, or `max_seq_len` slots per request).
    token_bytes: bytes of those that hold a token's K and V.
    num_requests_fit: how many requests, taken in order, fit in the budget; None without one.
    """

    reserved_bytes: int
    token_bytes: int
    num_requests_fit: int | None

    @property
    def fragmentation_pct(self) -> float:
        """Internal fragmentation, `100 * (1 - token_bytes / reserved_bytes)`."""
        if self.reserved_bytes == 0:
            return 0.0
        return 100.0 * (1.0 - self.token_bytes / self.reserved_bytes)


@dataclass(frozen=True)
class MemoryReport:
    """`memory_report`'s result: paged (at `block_size`) and contiguous usage of one workload.

    num_blocks: paged blocks in use, shared prefix blocks counted once.
    num_shared_blocks: of those, the blocks held by more than one request (full blocks of a
        prefix that several requests share).
    """

    workload_name: str
    num_requests: int
    max_seq_len: int
    block_size: int
    bytes_per_token: int
    budget_bytes: int | None
    num_blocks: int
    num_shared_blocks: int
    paged: CacheUsage
    contiguous: CacheUsage


@dataclass(frozen=True)
class FragmentationSweep:
    """`fragmentation_sweep`'s result. Arrays are `[num_block_sizes]`, aligned with `block_sizes`.

    block_sizes: int64.
    reserved_bytes, token_bytes: int64, paged cache at each block size.
    fragmentation_pct: float64, paged internal fragmentation at each block size.
    contiguous: the contiguous cache (independent of block size).
    """

    block_sizes: np.ndarray
    reserved_bytes: np.ndarray
    token_bytes: np.ndarray
    fragmentation_pct: np.ndarray
    contiguous: CacheUsage


def _first_in_group(prefix_group: np.ndarray) -> np.ndarray:
    """bool `[num_requests]`: the request is the first (in order) of its prefix group."""
    first = np.zeros(prefix_group.shape, dtype=bool)
    groups, first_ids = np.unique(prefix_group, return_index=True)
    first[first_ids[groups >= 0]] = True
    return first


def _paged_costs(workload: Workload, block_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks and distinct tokens each request adds to a paged cache, in request order.

    Returns int64 `(num_new_blocks, num_new_tokens)`, each `[num_block_sizes, num_requests]`:
    the first request of a prefix group pays for the group's shared blocks; the others reuse them.
    """
    bs = block_sizes[:, None]  # [B, 1]
    seq_lens = workload.seq_lens[None, :]  # [1, N]
    num_blocks = ceil_div(seq_lens, bs)  # [B, N]
    num_shared = workload.request_prefix_lens[None, :] // bs  # [B, N] full prefix blocks
    reuses = (workload.prefix_group >= 0) & ~_first_in_group(workload.prefix_group)
    num_new_blocks = num_blocks - reuses * num_shared
    num_new_tokens = seq_lens - reuses * num_shared * bs
    return num_new_blocks, num_new_tokens


def _num_fit(cum_units: np.ndarray, unit_bytes: int, budget_bytes: float | None) -> int | None:
    """Requests that fit, given non-decreasing cumulative units `[num_requests]` of
    `unit_bytes` each (counted in units, so that no byte count passes int64)."""
    if budget_bytes is None:
        return None
    units = budget_bytes // unit_bytes
    if units >= cum_units[-1]:
        return len(cum_units)
    return int(np.searchsorted(cum_units, units, side="right"))


def _contiguous_usage(
    workload: Workload, bytes_per_token: int, budget_bytes: float | None
) -> CacheUsage:
    per_request = workload.max_seq_len * bytes_per_token
    return CacheUsage(
        reserved_bytes=workload.num_requests * per_request,
        token_bytes=int(workload.seq_lens.sum()) * bytes_per_token,
        num_requests_fit=_num_fit(np.arange(1, workload.num_requests + 1, dtype=np.int64),
                                  per_request, budget_bytes),
    )


def memory_report(
    workload: Workload,
    bytes_per_token: int,
    block_size: int,
    budget_bytes: int | None = None,
) -> MemoryReport:
    """Paged (at `block_size`) vs contiguous KV memory of `workload` at its final lengths.

    Args:
        workload: the requests; all are live at once.
        bytes_per_token: K and V bytes of one token over all layers, >= 1
            (`ModelConfig.kv_bytes_per_token()`).
        block_size: tokens per block, a power of two in [1, 256].
        budget_bytes: KV memory available, a finite number >= 0; None skips the
            requests-that-fit count.

    Raises ValueError naming the argument when one is out of range. Byte counts are Python
    ints: exact at any size.
    """
    check_positive_int("bytes_per_token", bytes_per_token)
    check_block_size(block_size)
    if budget_bytes is not None and not (is_real(budget_bytes) and budget_bytes >= 0):
        raise ValueError(f"budget_bytes={budget_bytes!r}: must be >= 0 (a finite number of "
                         "bytes) or None")
    num_new_blocks, num_new_tokens = _paged_costs(workload, np.array([block_size], dtype=np.int64))
    num_new_blocks, num_new_tokens = num_new_blocks[0], num_new_tokens[0]
    block_bytes = int(block_size) * int(bytes_per_token)
    num_blocks = int(num_new_blocks.sum())
    group_ids, group_sizes = np.unique(
        workload.prefix_group[workload.prefix_group >= 0], return_counts=True
    )
    shared_group_ids = group_ids[group_sizes > 1]
    paged = CacheUsage(
        reserved_bytes=num_blocks * block_bytes,
        token_bytes=int(num_new_tokens.sum()) * bytes_per_token,
        num_requests_fit=_num_fit(np.cumsum(num_new_blocks), block_bytes, budget_bytes),
    )
    return MemoryReport(
        workload_name=workload.name,
        num_requests=workload.num_requests,
        max_seq_len=workload.max_seq_len,
        block_size=block_size,
        bytes_per_token=bytes_per_token,
        budget_bytes=budget_bytes,
        num_blocks=num_blocks,
        num_shared_blocks=int((workload.prefix_lens[shared_group_ids] // block_size).sum()),
        paged=paged,
        contiguous=_contiguous_usage(workload, bytes_per_token, budget_bytes),
    )


def fragmentation_sweep(
    workload: Workload,
    bytes_per_token: int,
    block_sizes=BLOCK_SIZES,
) -> FragmentationSweep:
    """Paged reserved bytes and internal fragmentation of `workload` at each block size.

    Args:
        workload: the requests at their final lengths.
        bytes_per_token: K and V bytes of one token over all layers, >= 1.
        block_sizes: a non-empty sequence (any iterable) of powers of two in [1, 256].

    Raises ValueError naming the argument when one is out of range, or when a byte count would
    pass int64.
    """
    check_positive_int("bytes_per_token", bytes_per_token)
    block_sizes = as_list("block_sizes", block_sizes, "a sequence of powers of two in [1, 256]")
    if len(block_sizes) == 0:
        raise ValueError("block_sizes=(): must hold at least one block size")
    for block_size in block_sizes:
        check_block_size(block_size)
    sizes = np.asarray(block_sizes, dtype=np.int64)
    num_new_blocks, num_new_tokens = _paged_costs(workload, sizes)
    reserved_tokens = num_new_blocks.sum(axis=1) * sizes  # >= the tokens held
    if int(reserved_tokens.max()) * int(bytes_per_token) > INT64_MAX:
        raise ValueError(f"bytes_per_token={bytes_per_token}: the workload's "
                         f"{int(reserved_tokens.max())} reserved tokens pass int64 bytes")
    reserved = reserved_tokens * int(bytes_per_token)
    tokens = num_new_tokens.sum(axis=1) * int(bytes_per_token)
    fragmentation = np.where(reserved > 0, 100.0 * (1.0 - tokens / np.maximum(reserved, 1)), 0.0)
    return FragmentationSweep(
        block_sizes=sizes,
        reserved_bytes=reserved,
        token_bytes=tokens,
        fragmentation_pct=fragmentation,
        contiguous=_contiguous_usage(workload, bytes_per_token, None),
    )


def replay_block_tables(
    workload: Workload, block_size: int, max_requests: int = 64
) -> tuple[list[list[int]], list[int]]:
    """Block tables of the first `max_requests` requests, as `BlockManager` allocates them.

    Each request is added at its full length with `workload.token_ids(i)`, so shared prefixes
    share their full blocks. Returns `(block_tables, seq_lens)`: per request, the physical block
    ids in logical order, and its token count.

    Raises ValueError for `block_size` not a power of two in [1, 256] or `max_requests` < 1.
    """
    check_block_size(block_size)
    check_positive_int("max_requests", max_requests)
    seq_lens = [int(n) for n in workload.seq_lens[:max_requests]]
    if not seq_lens:
        return [], []
    # NOTE: room for every block unshared; prefix sharing only ever needs fewer.
    manager = BlockManager(sum(ceil_div(n, block_size) for n in seq_lens), block_size)
    seq_ids = [
        manager.add_sequence(n, workload.token_ids(i)).seq_id for i, n in enumerate(seq_lens)
    ]
    return [manager.block_table(seq_id) for seq_id in seq_ids], seq_lens
