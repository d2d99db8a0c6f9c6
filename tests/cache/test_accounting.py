"""Memory accounting: the analytic paged counts must equal what BlockManager really allocates."""

import pytest
from factories import make_workload_of
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.cache.accounting import (
    BLOCK_SIZES,
    fragmentation_sweep,
    memory_report,
    replay_block_tables,
)
from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import OutOfBlocksError
from kvlab.workload import make_workload, shared_prefix, uniform

BYTES_PER_TOKEN = 3  # odd on purpose: a bytes/tokens mix-up cannot cancel out



def replay(workload, block_size, num_blocks=None):
    """Add every request, in order, to a real BlockManager until it runs out of blocks."""
    if num_blocks is None:
        num_blocks = int(sum(-(-workload.seq_lens // block_size)))
    manager = BlockManager(num_blocks, block_size)
    seq_ids = []
    for i, seq_len in enumerate(workload.seq_lens.tolist()):
        try:
            seq_ids.append(manager.add_sequence(seq_len, workload.token_ids(i)).seq_id)
        except OutOfBlocksError:
            break
    return manager, seq_ids


def stored_tokens(manager, seq_ids):
    """Token slots in use, each distinct physical block counted once."""
    bs = manager.block_size
    filled = {}
    for seq_id in seq_ids:
        seq_len = manager.seq_len(seq_id)
        for j, block_id in enumerate(manager.block_table(seq_id)):
            filled[block_id] = max(filled.get(block_id, 0), min(bs, seq_len - j * bs))
    return sum(filled.values())


WORKLOADS = {
    # Prefix 13 (not a multiple of any block size > 1), three groups, odd lengths.
    "prefix13": shared_prefix(
        uniform(40, (1, 60), (0, 30), seed=1), 0.6, 13, num_prefixes=3, seed=2
    ),
    # Prefix a multiple of 16 and 32, prompts that are only the prefix, output 0.
    "prefix32_exact": make_workload_of(
        [32, 32, 33, 40, 5], [0, 0, 31, 1, 0], 64, prefix_group=[0, 0, 0, 0, -1], prefix_lens=[32]
    ),
    # One member per group: nothing is actually shared.
    "lonely_groups": make_workload_of(
        [20, 30], [4, 4], 40, prefix_group=[0, 1], prefix_lens=[17, 20]
    ),
    "no_prefix": uniform(25, (1, 100), (0, 50), seed=5),
    "chat": make_workload("chat (lognormal)", 60, 2048, 0.5, prefix_len=300, num_prefixes=2),
}


@pytest.mark.parametrize("block_size", [1, 2, 4, 16, 64, 256])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_paged_counts_equal_the_allocator(name, block_size):
    workload = WORKLOADS[name]
    manager, seq_ids = replay(workload, block_size)
    assert len(seq_ids) == workload.num_requests
    report = memory_report(workload, BYTES_PER_TOKEN, block_size)
    num_used = manager.num_blocks - manager.num_free_blocks
    assert report.num_blocks == num_used
    assert report.paged.reserved_bytes == num_used * block_size * BYTES_PER_TOKEN
    assert report.paged.token_bytes == stored_tokens(manager, seq_ids) * BYTES_PER_TOKEN
    all_ids = {b for s in seq_ids for b in manager.block_table(s)}
    shared = {b for b in all_ids if manager.pool.ref_cnt(b) > 1}
    assert report.num_shared_blocks == len(shared)


@pytest.mark.parametrize("block_size", [1, 8, 32])
@pytest.mark.parametrize("name", ["prefix13", "prefix32_exact", "chat"])
def test_requests_that_fit_equal_the_allocator(name, block_size):
    workload = WORKLOADS[name]
    block_bytes = block_size * BYTES_PER_TOKEN
    full = memory_report(workload, BYTES_PER_TOKEN, block_size).num_blocks
    for num_blocks in (1, full // 3, full // 2 + 1, full - 1, full):
        budget = num_blocks * block_bytes + block_bytes - 1  # a partial block buys nothing
        _, seq_ids = replay(workload, block_size, num_blocks=max(num_blocks, 1))
        report = memory_report(workload, BYTES_PER_TOKEN, block_size, budget_bytes=budget)
        assert report.paged.num_requests_fit == len(seq_ids)


@settings(max_examples=60, deadline=None)
@given(
    seq=st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 10), st.integers(-1, 2)),
        min_size=1,
        max_size=12,
    ),
    prefix_lens=st.lists(st.integers(1, 20), min_size=3, max_size=3),
    log2_block_size=st.integers(0, 5),
)
def test_paged_counts_equal_the_allocator_on_random_workloads(seq, prefix_lens, log2_block_size):
    block_size = 2**log2_block_size
    group = [g for _, _, g in seq]
    prompt = [p + (prefix_lens[g] if g >= 0 else 0) for p, _, g in seq]
    output = [o for _, o, _ in seq]
    workload = make_workload_of(prompt, output, 80, group, prefix_lens)
    manager, seq_ids = replay(workload, block_size)
    report = memory_report(workload, BYTES_PER_TOKEN, block_size)
    assert report.num_blocks == manager.num_blocks - manager.num_free_blocks
    assert report.paged.token_bytes == stored_tokens(manager, seq_ids) * BYTES_PER_TOKEN


def test_hand_computed_example():
    # Prefix of 10 tokens, block size 4: 2 full shared blocks; the block holding tokens 8..11
    # mixes prefix and private tokens, so each request keeps its own.
    w = make_workload_of([10, 11, 6], [3, 0, 2], 16, prefix_group=[0, 0, -1], prefix_lens=[10])
    report = memory_report(w, bytes_per_token=2, block_size=4, budget_bytes=4 * 8 + 7)
    assert report.num_blocks == 4 + (3 - 2) + 2
    assert report.num_shared_blocks == 2
    assert report.paged.reserved_bytes == 7 * 4 * 2
    assert report.paged.token_bytes == (13 + 11 - 8 + 8) * 2
    assert report.paged.num_requests_fit == 1  # request 0 needs 4 blocks, request 1 one more
    assert report.contiguous.reserved_bytes == 3 * 16 * 2
    assert report.contiguous.token_bytes == (13 + 11 + 8) * 2
    assert report.contiguous.num_requests_fit == 1  # 39 bytes < 2 * 32
    assert report.contiguous.fragmentation_pct == pytest.approx(100 * (1 - 32 / 48))
    assert report.paged.fragmentation_pct == pytest.approx(100 * (1 - 48 / 56))


def test_no_budget_counts_nothing_and_zero_budget_fits_nothing():
    w = WORKLOADS["no_prefix"]
    assert memory_report(w, 2, 16).paged.num_requests_fit is None
    zero = memory_report(w, 2, 16, budget_bytes=0)
    assert zero.paged.num_requests_fit == 0 and zero.contiguous.num_requests_fit == 0


def test_sweep_matches_memory_report_at_every_block_size():
    w = WORKLOADS["chat"]
    sweep = fragmentation_sweep(w, BYTES_PER_TOKEN)
    assert sweep.block_sizes.tolist() == list(BLOCK_SIZES)
    for k, block_size in enumerate(BLOCK_SIZES):
        report = memory_report(w, BYTES_PER_TOKEN, block_size)
        assert sweep.reserved_bytes[k] == report.paged.reserved_bytes
        assert sweep.token_bytes[k] == report.paged.token_bytes
        assert sweep.fragmentation_pct[k] == pytest.approx(report.paged.fragmentation_pct)
    assert sweep.contiguous == memory_report(w, BYTES_PER_TOKEN, 16).contiguous



@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_replay_block_tables_matches_the_analytic_count(block_size):
    w = WORKLOADS["prefix13"]
    block_tables, seq_lens = replay_block_tables(w, block_size, max_requests=25)
    assert seq_lens == w.seq_lens[:25].tolist()
    assert [len(t) for t in block_tables] == [-(-n // block_size) for n in seq_lens]
    first = make_workload_of(
        w.prompt_lens[:25], w.output_lens[:25], w.max_seq_len, w.prefix_group[:25], w.prefix_lens
    )
    num_distinct = len({b for table in block_tables for b in table})
    assert num_distinct == memory_report(first, 1, block_size).num_blocks


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda w: memory_report(w, 2, 48), r"block_size=48: must be a power of two in \[1, 256\]"),
        (lambda w: memory_report(w, 2, 512), r"block_size=512"),
        (lambda w: memory_report(w, 0, 16), r"bytes_per_token=0"),
        (lambda w: memory_report(w, 2, 16, budget_bytes=-1), r"budget_bytes=-1: must be >= 0"),
        (lambda w: fragmentation_sweep(w, 2, [16, 24]), r"block_size=24"),
        (lambda w: fragmentation_sweep(w, 2, [16.5]), r"block_size=16.5"),
        (lambda w: fragmentation_sweep(w, 2, []), r"block_sizes=\(\)"),
        (lambda w: replay_block_tables(w, 16, max_requests=0), r"max_requests=0"),
    ],
)
def test_rejects_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(WORKLOADS["no_prefix"])
