"""The kernels' address streams, and what they do to the L2 (CPU)."""

import dataclasses
import re

import numpy as np
import pytest

from kvlab.kernels.geometry import VLLM_NUM_WARPS as NUM_WARPS
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim import L2Cache, TraceSpec, simulate
from kvlab.sim.l2 import DEMAND, PREFETCH, PREFETCH_LINES, SECTOR_BYTES
from kvlab.sim.spec import (
    block_tables,
    cta_phases,
    iterations_per_cta,
    schedule,
    timed_schedule,
)
from kvlab.sim.trace import requests


def make_spec(**fields) -> TraceSpec:
    """A small decode step: 2 sequences of 97 tokens, 4:2 heads, 4 CTA slots."""
    defaults = dict(family="vllm_v1", num_seqs=2, context=97, num_qo_heads=4, num_kv_heads=2,
                    partition_size=0, ctas_per_sm=2, num_sms=2)
    return TraceSpec(**{**defaults, **fields})


def byte_counts(spec: TraceSpec, kind=None) -> np.ndarray:
    """[2, num_seqs, blocks_per_seq, num_kv_heads, block_size, head_dim * dtype_bytes]: how often
    each byte of K (0) and V (1) is in a request of `kind` (default: loads), by logical block."""
    kind = DEMAND if kind is None else kind
    addrs, nbytes, kinds, _ = requests(spec)
    counts = np.zeros(2 * spec.v_base, dtype=np.int64)
    for addr, size in zip(addrs[kinds == kind], nbytes[kinds == kind], strict=True):
        counts[addr:addr + size] += 1
    # physical [2, num_blocks, num_kv_heads, block_size, row bytes] -> logical block order
    rows = counts.reshape(2, -1, spec.num_kv_heads, spec.block_size, spec.tile_bytes //
                          spec.block_size)
    return rows[:, block_tables(spec)]


def valid_rows(spec: TraceSpec) -> np.ndarray:
    """The byte_counts shape, True for the bytes of tokens < context."""
    tokens = np.arange(spec.blocks_per_seq * spec.block_size).reshape(-1, 1, spec.block_size, 1)
    valid = np.broadcast_to(tokens < spec.context, (spec.blocks_per_seq, spec.num_kv_heads,
                                                    spec.block_size, 1))
    shape = (2, spec.num_seqs, *valid.shape[:-1], spec.tile_bytes // spec.block_size)
    return np.broadcast_to(valid, shape)


def test_schedule_round_robin_over_slots():
    cta_ids, iterations, round_starts = schedule(np.array([2, 1, 0, 3]), 2)
    # round 0: CTAs 0, 1; round 1: CTA 0, then CTA 3 in CTA 1's slot (CTA 2 returns at once);
    # rounds 2 and 3: CTA 3 alone
    assert list(zip(cta_ids, iterations, strict=True)) == [
        (0, 0), (1, 0), (0, 1), (3, 0), (3, 1), (3, 2)]
    assert list(round_starts) == [0, 2, 4, 5, 6]
    cta_ids, iterations, round_starts = schedule(np.array([2, 1, 3]), 1)
    assert list(cta_ids) == [0, 0, 1, 2, 2, 2] and list(iterations) == [0, 1, 0, 0, 1, 2]
    assert list(round_starts) == list(range(7))  # one slot: one turn per round


@pytest.mark.parametrize("num_slots", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schedule_rounds_are_lockstep_turns(num_slots, seed):
    steps = np.random.default_rng(seed).integers(0, 6, 40)
    steps[seed] = 30  # one long CTA among short ones
    cta_ids, iterations, round_starts = schedule(steps, num_slots)
    assert round_starts[0] == 0 and round_starts[-1] == steps.sum()
    assert (np.diff(round_starts) >= 1).all() and (np.diff(round_starts) <= num_slots).all()
    rounds = np.repeat(np.arange(len(round_starts) - 1), np.diff(round_starts))
    for cta in np.flatnonzero(steps):  # a CTA's iterations in consecutive rounds, one per round
        mine = cta_ids == cta
        assert (iterations[mine] == np.arange(steps[cta])).all()
        assert (np.diff(rounds[mine]) == 1).all()


@pytest.mark.parametrize("jitter_rounds", [0.0, 0.5, 1.0])
def test_requests_come_at_the_round_of_their_cta_iteration(jitter_rounds):
    spec = make_spec(context=320, prefetch=PrefetchConfig("bulk"), jitter_rounds=jitter_rounds)
    times = requests(spec)[3]  # 8 CTAs of 2 x 5 iterations
    # 4 slots: CTAs 0-3 in rounds 0-9, CTAs 4-7 in rounds 10-19; each iteration 4 loads and 4
    # prefetches, but none in the last iteration of the K loop and of the V loop
    assert (np.diff(times) >= 0).all()
    assert (np.bincount(np.floor(times).astype(np.int64)) == 4 * np.tile([8, 8, 8, 8, 4], 4)).all()
    assert ((times % 1 == 0) if jitter_rounds == 0 else (times % 1 < jitter_rounds)).all()


def test_with_no_jitter_the_schedule_is_lockstep_rounds():
    spec = make_spec(context=320, num_seqs=3, jitter_rounds=0)  # 12 CTAs on 4 slots
    cta_ids, iterations, round_starts = schedule(iterations_per_cta(spec), 4)
    timed = timed_schedule(spec)
    assert (timed[0] == cta_ids).all() and (timed[1] == iterations).all()
    assert (timed[2] == np.repeat(np.arange(round_starts.size - 1), np.diff(round_starts))).all()
    assert (cta_phases(spec) == 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_phases_reorder_iterations_only_within_their_round(seed):
    spec = make_spec(context=320, num_seqs=3, jitter_rounds=1.0, seed=seed)
    phases = cta_phases(spec)
    assert ((0 <= phases) & (phases < 1)).all() and len(set(phases)) == phases.size
    cta_ids, iterations, times = timed_schedule(spec)
    lockstep = timed_schedule(dataclasses.replace(spec, jitter_rounds=0))
    assert (np.floor(times) == lockstep[2]).all() and (times == lockstep[2] + phases[cta_ids]).all()
    assert (np.diff(times) >= 0).all()
    for cta in range(phases.size):  # a CTA's iterations in order, one round apart
        assert (iterations[cta_ids == cta] == np.arange((cta_ids == cta).sum())).all()
        assert (np.diff(times[cta_ids == cta]) == 1).all()


def test_phases_are_deterministic_for_a_seed_and_apart_from_the_placement():
    spec = make_spec(context=320, placement="contiguous", jitter_rounds=0.75)
    assert all((a == b).all() for a, b in zip(requests(spec), requests(spec), strict=True))
    other = requests(dataclasses.replace(spec, seed=1))
    assert (np.sort(other[0]) == np.sort(requests(spec)[0])).all()  # the same blocks
    assert (other[0] != requests(spec)[0]).any() and (other[3] != requests(spec)[3]).any()
    assert (cta_phases(dataclasses.replace(spec, placement="random")) == cta_phases(spec)).all()


@pytest.mark.parametrize("context", [1, 17, 97])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize(("block_size", "partition_size"), [(8, 0), (16, 0), (16, 32), (32, 64)])
def test_vllm_reads_every_tile_once_per_query_head(context, heads, block_size, partition_size):
    spec = make_spec(context=context, num_qo_heads=heads[0], num_kv_heads=heads[1],
                     block_size=block_size, partition_size=partition_size)
    addrs, nbytes, _, _ = requests(spec)
    assert (nbytes == spec.tile_bytes).all() and (addrs % spec.tile_bytes == 0).all()
    assert (spec.tile_bytes // SECTOR_BYTES) * len(addrs) == (
        2 * spec.num_seqs * spec.blocks_per_seq * spec.num_qo_heads * spec.tile_bytes
        // SECTOR_BYTES)
    # whole tiles, also the slots past the context in the last block
    assert (byte_counts(spec) == heads[0] // heads[1]).all()


@pytest.mark.parametrize("context", [1, 17, 97, 300])
@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 256])
@pytest.mark.parametrize(("partition_size", "warps"), [(0, 4), (64, 4), (128, 4), (0, 8),
                                                       (128, 8)])
def test_gqa_reads_every_token_once_per_kv_head(context, block_size, partition_size, warps):
    spec = make_spec(family="gqa", context=context, num_qo_heads=6, num_kv_heads=2,
                     block_size=block_size, partition_size=partition_size, warps=warps)
    assert (byte_counts(spec) == valid_rows(spec)).all()  # never the slots past the context
    assert (requests(spec)[1] % SECTOR_BYTES == 0).all()  # whole rows of 256 bytes


@pytest.mark.parametrize("distance", [1, 2])
@pytest.mark.parametrize("block_size", [8, 16])
def test_vllm_prefetches_the_tile_distance_strides_ahead(distance, block_size):
    spec = make_spec(context=300, block_size=block_size, num_sms=1, ctas_per_sm=1,
                     prefetch=PrefetchConfig("bulk", distance=distance))
    addrs, nbytes, kinds, _ = requests(spec)
    # logical (cache, seq, block, kv head) of each request; one slot: CTAs one after another
    cache, offset = np.divmod(addrs, spec.v_base)
    physical, kv_head = np.divmod(offset // spec.tile_bytes, spec.num_kv_heads)
    seq, block = np.divmod(np.argsort(block_tables(spec).ravel())[physical], spec.blocks_per_seq)
    prefetches = np.flatnonzero(kinds == PREFETCH)
    loads = prefetches - 1
    assert (kinds[loads] == DEMAND).all()  # each right after the load it runs ahead of
    for x in (cache, seq, kv_head):
        assert (x[prefetches] == x[loads]).all()
    assert (block[prefetches] == block[loads] + distance * NUM_WARPS).all()
    assert (block[prefetches] < spec.blocks_per_seq).all()
    # every block but the first distance * NUM_WARPS, once per query head and loop
    num_ahead = spec.blocks_per_seq - distance * NUM_WARPS
    assert len(prefetches) == 2 * spec.num_seqs * spec.num_qo_heads * num_ahead


@pytest.mark.parametrize(("mode", "kind"), [("bulk", PREFETCH), ("line", PREFETCH_LINES)])
@pytest.mark.parametrize("block_size", [8, 16, 32, 128])
@pytest.mark.parametrize(("distance", "warps"), [(1, 4), (3, 4), (1, 8)])
def test_gqa_prefetches_each_token_of_the_tiles_ahead_once(mode, kind, block_size, distance,
                                                           warps):
    spec = make_spec(family="gqa", context=300, block_size=block_size, partition_size=256,
                     prefetch=PrefetchConfig(mode, distance=distance), warps=warps)
    # tiles [distance, num_tiles) of each 256-token partition, not past the context; a tile is
    # 16 tokens a warp
    tile_tokens = 16 * warps
    tile = np.arange(spec.blocks_per_seq * block_size) % 256 // tile_tokens
    ahead = (tile >= distance).reshape(-1, 1, block_size, 1) & valid_rows(spec)
    assert ahead.any() and (byte_counts(spec, kind) == ahead).all()
    addrs, _, kinds, _ = requests(spec)  # one request per run of min(block_size, tile) tokens
    assert (addrs[kinds == kind] % (min(block_size, tile_tokens) * 256) == 0).all()


def test_prefetch_only_k_or_only_v():
    for k, v in ((True, False), (False, True)):
        spec = make_spec(context=300, prefetch=PrefetchConfig("bulk", k=k, v=v))
        counts = byte_counts(spec, PREFETCH)
        assert (counts[0].any(), counts[1].any()) == (k, v)


def test_placement():
    contiguous = block_tables(make_spec(placement="contiguous"))
    assert (contiguous.ravel() == np.arange(contiguous.size)).all()
    random = block_tables(make_spec(seed=3))
    assert (np.sort(random.ravel()) == contiguous.ravel()).all()
    assert (random != contiguous).any()
    assert (block_tables(make_spec(seed=3)) == random).all()
    assert (block_tables(make_spec(seed=4)) != random).any()


def test_gqa_siblings_share_the_l2_in_vllm_and_not_in_gqa():
    spec = make_spec(num_qo_heads=8, num_kv_heads=2)  # group 4, K and V 400 KiB: fits
    vllm = simulate(spec, L2Cache(fill_latency_rounds=0))  # instant fills
    assert vllm.hit_rate == 3 / 4  # the first query head of a group misses, 3 siblings hit
    gqa = simulate(dataclasses.replace(spec, family="gqa"))
    assert gqa.hit_rate == gqa.lookup_hit_rate == 0.0  # each KV byte asked once: no hit
    assert gqa.dram_bytes == 2 * spec.num_seqs * spec.context * spec.num_kv_heads * 256
    assert vllm.dram_bytes == 2 * spec.v_base  # whole tiles, padding included


def test_prefetch_turns_misses_into_hits_at_the_same_dram_bytes():
    spec = make_spec(context=4096, num_qo_heads=2, num_kv_heads=2, num_sms=4)
    base = simulate(spec)
    prefetched = simulate(dataclasses.replace(spec, prefetch=PrefetchConfig("bulk")))
    assert base.hit_rate == 0.0 and prefetched.dram_bytes == base.dram_bytes
    assert prefetched.prefetch_used == prefetched.prefetch_misses == prefetched.demand_hits
    # one CTA per (query head, sequence): its first NUM_WARPS blocks of K and of V miss
    misses = 2 * spec.num_seqs * spec.num_qo_heads * NUM_WARPS * spec.tile_bytes // SECTOR_BYTES
    assert prefetched.demand_misses == misses


def test_prefetch_too_far_ahead_for_a_small_l2_is_evicted_unused():
    spec = make_spec(context=4096, num_qo_heads=2, num_kv_heads=2,
                     prefetch=PrefetchConfig("bulk", distance=16))
    result = simulate(spec, L2Cache(num_sets=64, num_ways=4))  # 32 KiB
    assert result.prefetch_evicted_unused > 0
    assert result.prefetch_used < result.prefetch_misses


@pytest.mark.parametrize(("fields", "message"), [
    ({"family": "flash"}, "family='flash': must be one of ('vllm_v1', 'gqa')"),
    ({"num_seqs": 0}, "num_seqs=0: must be an integer >= 1"),
    ({"block_size": 64}, "block_size=64: must be one of (8, 16, 32) for vllm_v1"),
    ({"partition_size": 100}, "partition_size=100: must be 0 or a multiple of 16 for vllm_v1"),
    ({"family": "gqa", "partition_size": 32},
     "partition_size=32: must be 0 or a multiple of 64 for gqa"),
    ({"family": "gqa", "partition_size": 64, "warps": 8},
     "partition_size=64: must be 0 or a multiple of 128 for gqa"),
    ({"family": "gqa", "warps": 6}, "warps=6: must be one of (4, 8) for gqa"),
    ({"warps": 8}, "warps=8: must be one of (4,) for vllm_v1"),
    ({"family": "gqa", "num_qo_heads": 18},
     "num_qo_heads=18: must be at most 8 x num_kv_heads=2 for gqa"),
    ({"num_qo_heads": 5}, "num_qo_heads=5: must be divisible by num_kv_heads=2"),
    ({"prefetch": PrefetchConfig("bulk", evict_last=True)}, "evict_last (not modelled)"),
    ({"prefetch": "bulk"}, "prefetch='bulk': must be a PrefetchConfig"),
    ({"placement": "striped"}, "placement='striped': must be one of ('random', 'contiguous')"),
    ({"dtype_bytes": 3}, "dtype_bytes=3: must be one of (1, 2, 4)"),
    *(({"jitter_rounds": value}, f"jitter_rounds={value!r}: must be a number in [0, 1]")
      for value in (-0.1, 1.5, float("nan"), True, "0.5")),
])
def test_bad_spec(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_spec(**fields)
