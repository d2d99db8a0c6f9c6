"""The L2 model on traces worked out by hand (CPU)."""

import re

import numpy as np
import pytest

from kvlab.sim.l2 import (
    DEMAND,
    KINDS,
    L2_BYTES,
    LINE_BYTES,
    NUM_SETS,
    NUM_WAYS,
    PREFETCH,
    PREFETCH_LINES,
    SECTOR_BYTES,
    L2Cache,
    L2Result,
)


def make_cache(num_sets=4, num_ways=2) -> L2Cache:
    """A tiny cache whose sets are line % num_sets, so traces can be followed by hand; its fills
    are instant (fills that take time: test_fill_latency.py)."""
    return L2Cache(num_sets, num_ways, set_index="modulo", fill_latency_rounds=0)


def read(cache, *lines, kind=DEMAND, sector=None) -> L2Result:
    """Requests of whole lines (or of one `sector` of each), in order."""
    offset, size = (0, LINE_BYTES) if sector is None else (sector * SECTOR_BYTES, SECTOR_BYTES)
    return cache.access(np.array(lines, dtype=np.int64) * LINE_BYTES + offset, size, kind)


def test_h200_geometry():
    cache = L2Cache()
    assert (cache.num_sets, cache.num_ways) == (NUM_SETS, NUM_WAYS) == (30_720, 16)
    assert cache.size_bytes == L2_BYTES == 60 * 2**20


def test_cold_misses_then_reuse_hits():
    cache = make_cache()
    first = read(cache, 0, 1, 2)
    assert (first.demand_hits, first.demand_misses) == (0, 12)
    assert first.dram_bytes == 12 * SECTOR_BYTES and first.hit_rate == 0.0
    again = read(cache, 2, 0)
    assert (again.demand_hits, again.demand_misses, again.dram_bytes) == (8, 0, 0)
    assert (first + again).hit_rate == 8 / 20


def test_a_miss_fills_only_its_sector():
    cache = make_cache()
    assert read(cache, 0, sector=0).demand_misses == 1
    assert read(cache, 0, sector=1).demand_misses == 1  # same line, another sector
    assert read(cache, 0, sector=0).demand_hits == 1
    whole = read(cache, 0)
    assert (whole.demand_hits, whole.demand_misses) == (2, 2)


def test_lookups_count_prefetches_and_the_fabric_as_ncu_does():
    cache = make_cache()
    prefetch, load = read(cache, 0, kind=PREFETCH), read(cache, 0)
    both = prefetch + load
    assert (both.hit_rate, both.lookup_hit_rate) == (1.0, 0.5)  # the prefetch's misses count
    # the prefetch filled each sector's home partition only: the half homed across the fabric
    # misses near on its first load, and hits across it
    assert (load.prefetch_used, load.near_hit_rate) == (4, 0.5)
    # 2 near hits + 2 of the fabric's 4 lookups (half a lookup per load and per prefetch): 1/3
    assert both.ncu_hit_rate == pytest.approx(1 / 3)
    again = read(cache, 0)  # read before by a load: near in both partitions
    assert again.near_hit_rate == again.ncu_hit_rate == again.hit_rate == 1.0
    pending = L2Cache(4, 2, set_index="modulo", fill_latency_rounds=1)
    late = pending.access([0], LINE_BYTES, PREFETCH, 0.0) + pending.access(
        [0], LINE_BYTES, DEMAND, 0.5)
    assert (late.demand_pending, late.hit_rate, late.near_hit_rate) == (4, 0.0, 0.0)
    empty = L2Result()
    assert empty.hit_rate == empty.near_hit_rate == empty.ncu_hit_rate == 0.0


def test_a_request_touches_the_sectors_it_overlaps():
    cache = make_cache()
    # bytes [96, 160): sector 3 of line 0 and sector 0 of line 1
    assert cache.access([96], [64], [DEMAND]).demand_misses == 2
    assert cache.access([100], [1], [DEMAND]).demand_hits == 1
    assert cache.access([128 + 32], [1], [DEMAND]).demand_misses == 1


def test_lru_evicts_the_least_recently_used_line_of_the_set():
    cache = make_cache()  # lines 0, 4, 8 share set 0 (2 ways)
    read(cache, 0, 4)
    assert read(cache, 0).demand_hits == 4  # 0 is now the most recent: 4 goes next
    assert read(cache, 8).demand_misses == 4
    assert read(cache, 0).demand_hits == 4
    assert read(cache, 4).demand_misses == 4
    assert read(cache, 1, 2, 3).demand_misses == 12  # the other sets never saw these


def test_capacity():
    fits = make_cache()
    read(fits, *range(8))  # 8 lines = 4 sets x 2 ways
    assert read(fits, *range(8)).hit_rate == 1.0
    too_big = make_cache()
    read(too_big, *range(12))  # 3 lines per set, read in a cycle: LRU keeps none of them
    assert read(too_big, *range(12)).hit_rate == 0.0


def test_a_prefetch_turns_a_miss_into_a_hit():
    cache = make_cache()
    prefetch = read(cache, 5, kind=PREFETCH)
    assert (prefetch.prefetch_misses, prefetch.prefetch_hits, prefetch.dram_bytes) == (4, 0, 128)
    demand = read(cache, 5)
    assert (demand.demand_hits, demand.demand_misses, demand.prefetch_used) == (4, 0, 4)
    assert demand.dram_bytes == 0
    assert read(cache, 5).prefetch_used == 0  # used once


def test_a_prefetch_evicted_before_use_saves_nothing():
    cache = make_cache()
    read(cache, 0, kind=PREFETCH)
    evicting = read(cache, 4, 8)  # set 0 has 2 ways: line 0 leaves
    assert evicting.prefetch_evicted_unused == 4
    late = read(cache, 0)
    assert (late.demand_misses, late.prefetch_used) == (4, 0)


def test_prefetch_of_resident_sectors_reads_no_dram():
    cache = make_cache()
    read(cache, 3, sector=2)
    prefetch = read(cache, 3, kind=PREFETCH)
    assert (prefetch.prefetch_hits, prefetch.prefetch_misses, prefetch.dram_bytes) == (1, 3, 96)


def test_line_prefetch_fills_the_whole_line_and_bulk_only_its_sectors():
    lines, bulk = make_cache(), make_cache()
    assert read(lines, 1, sector=2, kind=PREFETCH_LINES).prefetch_misses == 4
    assert read(bulk, 1, sector=2, kind=PREFETCH).prefetch_misses == 1
    assert read(lines, 1).demand_hits == 4
    assert read(bulk, 1).demand_hits == 1


@pytest.mark.parametrize(("mib", "hit_rate"), [(30, 1.0), (120, 0.0)])
def test_hashed_sets_hold_half_the_l2_and_lru_drops_twice_the_l2(mib, hit_rate):
    cache = L2Cache()
    addrs = np.arange(mib * 2**20 // 4096, dtype=np.int64) * 4096
    cache.access(addrs, 4096, DEMAND)
    assert cache.access(addrs, 4096, DEMAND).hit_rate == pytest.approx(hit_rate, abs=1e-3)


def test_deterministic():
    addrs = np.random.default_rng(0).integers(0, 1 << 16, 5000) * SECTOR_BYTES
    kinds = np.random.default_rng(1).integers(0, 3, 5000)
    results = [L2Cache(16, 4).access(addrs, 64, kinds) for _ in range(2)]
    assert results[0] == results[1]


@pytest.mark.parametrize("sets_per_group", [1, 3, 16])
def test_the_replay_by_set_groups_gives_what_the_requests_in_order_give(sets_per_group):
    """The replay sorts each chunk's lookups by set group; one request per call is replayed in
    plain order. Both must leave the same counts and the same contents (the probe's result)."""
    rng = np.random.default_rng(2)
    n = 3000
    addrs = rng.integers(0, 1 << 15, n) * SECTOR_BYTES
    nbytes = rng.integers(1, 600, n)
    kinds = rng.integers(0, len(KINDS), n)
    times = np.cumsum(rng.random(n) < 0.05) * 0.25
    grouped, in_order = (L2Cache(16, 4, fill_latency_rounds=0.5) for _ in range(2))
    grouped._sets_per_group = sets_per_group
    result = grouped.access(addrs, nbytes, kinds, times)
    assert result.demand_hits and result.demand_pending and result.prefetch_hits
    assert result.prefetch_evicted_unused
    assert result == sum((in_order.access(addrs[i:i + 1], nbytes[i], kinds[i], times[i])
                          for i in range(n)), L2Result())
    probe = rng.integers(0, 1 << 15, 500) * SECTOR_BYTES
    assert grouped.access(probe, 256, DEMAND) == in_order.access(probe, 256, DEMAND)


def test_empty_trace():
    result = make_cache().access(np.zeros(0, dtype=np.int64), 32, DEMAND)
    assert result == L2Result() and result.hit_rate == 0.0 and result.dram_bytes == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_sets": 0}, "num_sets=0: must be an integer >= 1"),
    ({"num_ways": 2.0}, "num_ways=2.0: must be an integer >= 1"),
    ({"set_index": "xor"}, "set_index='xor': must be one of ('hash', 'modulo')"),
])
def test_bad_geometry(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        L2Cache(**kwargs)


@pytest.mark.parametrize(("addrs", "nbytes", "kinds", "message"), [
    ([-32], 32, 0, "addrs=-32: must be >= 0"),
    ([0.0], 32, 0, "addrs: dtype=float64, shape=(1,): must be a 1-D integer array"),
    ([[0]], 32, 0, "addrs: dtype=int64, shape=(1, 1): must be a 1-D integer array"),
    ([0], 0, 0, "nbytes=0: must be >= 1"),
    ([0, 32], [32], 0, "nbytes: dtype=int64, shape=(1,): must be an integer or an integer "
                       "array of shape (2,)"),
    ([0], 32, 3, "kinds=3: must be one of (0, 1, 2)"),
    ([0], 32, True, "kinds: dtype=bool"),
    ([2**62], 32, 0, "addrs + nbytes=4611686018427387936: must be < 2**62"),
])
def test_bad_requests_leave_the_cache_unchanged(addrs, nbytes, kinds, message):
    cache, untouched = make_cache(), make_cache()
    read(cache, 0, 5, 1)
    read(untouched, 0, 5, 1)
    with pytest.raises(ValueError, match=re.escape(message)):
        cache.access(addrs, nbytes, kinds)
    probe = [0, 4, 8, 1, 0, 9, 5, 13, 1]  # hits and evictions depend on contents and LRU order
    assert read(cache, *probe) == read(untouched, *probe)
