"""Hostile values at filled_cache and the memory accounting: a ValueError naming the parameter,
raised before anything is allocated, or the exact result where Python's ints hold it."""

import math
import re

import numpy as np
import pytest
import torch
from factories import make_workload_of, no_hang

from kvlab.cache.accounting import fragmentation_sweep, memory_report
from kvlab.cache.filled import filled_cache

CPU = {"layout": "hnd", "dtype": torch.float32, "device": "cpu"}
WORKLOAD = make_workload_of([10, 20, 30], [5, 5, 5], 64)


@pytest.mark.parametrize(("args", "message"), [
    ((0, 8, 8), "num_seqs=0: must be an integer >= 1"),
    ((-1, 8, 8), "num_seqs=-1: must be an integer >= 1"),
    ((2, 8, 0), "block_size=0: must be a power of two"),
    ((2, True, 8), "context=True: must be an int >= 1 or 2 ints >= 1"),
    ((2, "12", 8), "context='12': must be an int >= 1 or 2 ints >= 1"),
    ((2, 2.5, 8), "context=2.5: must be an int >= 1 or 2 ints >= 1"),
    ((2, [1.5, 2], 8), "context=[1.5, 2]: must be an int >= 1 or 2 ints >= 1"),
])
def test_filled_cache_refuses_what_is_no_batch(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        filled_cache(*args, 1, 64, **CPU)


def test_filled_cache_takes_numpy_lengths():
    cache, seq_ids, siblings = filled_cache(np.int64(2), np.int64(16), 8, 1, 64,
                                            sibling=np.int64(8), **CPU)
    assert [cache.manager.seq_len(s) for s in seq_ids] == [16, 16]
    assert [cache.manager.seq_len(s) for s in siblings] == [8, 8]
    cache, seq_ids, _ = filled_cache(2, np.array([3, 9]), 8, 1, 64, **CPU)
    assert [cache.manager.seq_len(s) for s in seq_ids] == [3, 9]


def test_filled_cache_sizes_a_huge_batch_before_listing_it():
    with no_hang(), pytest.raises(ValueError, match="the K/V tensors need"):
        filled_cache(2**40, 8, 8, 1, 64, **CPU)


@pytest.mark.parametrize("bytes_per_token", [2**40, 2**60, 2**70])
def test_memory_report_counts_huge_tokens_exactly(bytes_per_token):
    report = memory_report(WORKLOAD, bytes_per_token, 16, budget_bytes=2**80)
    assert report.paged.reserved_bytes == report.num_blocks * 16 * bytes_per_token
    assert report.paged.token_bytes == int(WORKLOAD.seq_lens.sum()) * bytes_per_token
    assert report.contiguous.reserved_bytes == 3 * 64 * bytes_per_token
    assert report.paged.num_requests_fit == report.contiguous.num_requests_fit == 3


def test_memory_report_fits_as_many_requests_at_any_scale():
    small = memory_report(WORKLOAD, 2, 16, budget_bytes=200)
    huge = memory_report(WORKLOAD, 2 * 2**60, 16, budget_bytes=200 * 2**60)
    assert (huge.paged.num_requests_fit, huge.contiguous.num_requests_fit) == (
        small.paged.num_requests_fit, small.contiguous.num_requests_fit)


@pytest.mark.parametrize("budget", [True, "1", math.inf, math.nan])
def test_memory_report_budget_is_a_finite_byte_count(budget):
    with pytest.raises(ValueError, match=re.escape(f"budget_bytes={budget!r}: must be >= 0")):
        memory_report(WORKLOAD, 2, 16, budget_bytes=budget)


def test_fragmentation_sweep_refuses_bytes_past_int64():
    with pytest.raises(ValueError, match=re.escape(f"bytes_per_token={2**60}: the workload's")):
        fragmentation_sweep(WORKLOAD, 2**60)
    sweep = fragmentation_sweep(WORKLOAD, 2**40)
    assert sweep.reserved_bytes.dtype == np.int64 and (sweep.reserved_bytes > 0).all()


@pytest.mark.parametrize("sizes", [16, None, "16", b"16"])
def test_fragmentation_sweep_block_sizes_must_be_a_sequence(sizes):
    with pytest.raises(ValueError, match=re.escape(f"block_sizes={sizes!r}: must be a sequence")):
        fragmentation_sweep(WORKLOAD, 8, sizes)


def test_fragmentation_sweep_takes_any_iterable_of_block_sizes():
    sweep = fragmentation_sweep(WORKLOAD, 8, (size for size in (16, 32)))
    assert sweep.block_sizes.tolist() == [16, 32]
