"""Fills that take time: pending sectors, late prefetches, siblings in and out of lockstep (CPU)."""

import re
from collections import Counter, OrderedDict

import numpy as np
import pytest

from kvlab.kernels.geometry import VLLM_NUM_WARPS as NUM_WARPS
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim import L2Cache, TraceSpec, simulate
from kvlab.sim.l2 import (
    DEMAND,
    KINDS,
    LINE_BYTES,
    PREFETCH,
    PREFETCH_LINES,
    SECTOR_BYTES,
    L2Result,
)
from kvlab.sim.spec import cta_phases
from kvlab.sim.trace import requests


def make_cache(fill_latency_rounds=0.0) -> L2Cache:
    """A tiny cache (4 sets x 2 ways, set = line % 4), as in test_l2.py, with a fill latency."""
    return L2Cache(4, 2, set_index="modulo", fill_latency_rounds=fill_latency_rounds)


def read(cache, *lines, kind=DEMAND, sector=None, time=None) -> L2Result:
    """Requests of whole lines (or of one `sector` of each), in order, all at `time` (rounds)."""
    offset, size = (0, LINE_BYTES) if sector is None else (sector * SECTOR_BYTES, SECTOR_BYTES)
    return cache.access(np.array(lines, dtype=np.int64) * LINE_BYTES + offset, size, kind, time)


def reference(addrs, nbytes, kinds, times, num_sets, num_ways, set_index, latency) -> L2Result:
    """Slow and plain: per set an ordered dict of lines, least recently used first; per line
    {sector: [time its fill is ready, filled by a prefetch and not read yet]}."""
    sets = [OrderedDict() for _ in range(num_sets)]
    counts = Counter()
    for addr, size, kind, t in zip(addrs, nbytes, kinds, times, strict=True):
        for line in range(addr // LINE_BYTES, (addr + size - 1) // LINE_BYTES + 1):
            if set_index == "hash":
                index = ((line * 0x9E3779B97F4A7C15 % 2**64) >> 32) * num_sets >> 32
            else:
                index = line % num_sets
            lines = sets[index]
            if line not in lines:
                if len(lines) == num_ways:
                    evicted = lines.popitem(last=False)[1]
                    counts["prefetch_evicted_unused"] += sum(p for _, p in evicted.values())
                lines[line] = {}
            lines.move_to_end(line)
            held = lines[line]
            asked = [sector for sector in range(LINE_BYTES // SECTOR_BYTES)
                     if kind == PREFETCH_LINES or (addr < (start := line * LINE_BYTES + sector
                                                           * SECTOR_BYTES) + SECTOR_BYTES
                                                   and start < addr + size)]
            load = kind == DEMAND
            for sector in asked:
                who = "demand" if load else "prefetch"
                if sector not in held:
                    counts[f"{who}_misses"] += 1
                    held[sector] = [t + latency, not load]
                elif not load:
                    counts["prefetch_hits"] += 1
                else:
                    ready, prefetched = held[sector]
                    counts["demand_hits" if ready <= t else "demand_pending"] += 1
                    counts["prefetch_used"] += prefetched
                    counts["prefetch_late"] += prefetched and ready > t
                    held[sector][1] = False
    return L2Result(**counts)


def random_trace(seed, num_requests=3000, num_lines=96):
    """Requests over num_lines lines, sizes 1-300 bytes, all kinds, times stepping 0-1 rounds."""
    rng = np.random.default_rng(seed)
    addrs = rng.integers(0, num_lines * LINE_BYTES, num_requests)
    nbytes = rng.integers(1, 300, num_requests)
    kinds = rng.integers(0, len(KINDS), num_requests)
    times = np.cumsum(rng.choice([0.0, 0.0, 0.0, 0.25, 1.0], num_requests))
    return addrs, nbytes, kinds, times


@pytest.mark.parametrize("latency", [0.0, 0.25, 1.0, 3.0])
@pytest.mark.parametrize(("num_sets", "num_ways", "set_index"), [(4, 2, "modulo"),
                                                                  (8, 4, "hash")])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_reference(latency, num_sets, num_ways, set_index, seed):
    trace = random_trace(seed)
    cache = L2Cache(num_sets, num_ways, set_index=set_index, fill_latency_rounds=latency)
    result = cache.access(*trace)
    assert result == reference(*trace, num_sets, num_ways, set_index, latency)
    assert (result.demand_pending > 0) == (latency > 0)


def test_with_no_latency_times_change_nothing():
    addrs, nbytes, kinds, times = random_trace(2)
    timed = make_cache().access(addrs, nbytes, kinds, times)
    assert timed == make_cache().access(addrs, nbytes, kinds, 0.0)
    assert timed.demand_pending == timed.prefetch_late == 0 < timed.demand_hits


def test_a_second_access_before_the_fill_is_ready_is_pending():
    cache = make_cache(fill_latency_rounds=2)
    first = read(cache, 0, time=0)
    assert (first.demand_misses, first.dram_bytes) == (4, 128)
    for t in (0, 1.5):  # the same round, then still in flight: merged, no DRAM, no hit
        again = read(cache, 0, time=t)
        assert (again.demand_hits, again.demand_pending, again.dram_bytes) == (0, 4, 0)
        assert again.hit_rate == 0.0
    assert read(cache, 0, time=2).demand_hits == 4  # ready after the latency
    both = cache.access([128, 128], 128, DEMAND, 3)  # one round, one request after the other
    assert (both.demand_misses, both.demand_pending, both.dram_bytes) == (4, 4, 128)


@pytest.mark.parametrize(("demand_time", "hits", "pending"), [(1.0, 4, 0), (0.5, 0, 4)])
def test_a_prefetch_in_time_gives_hits_and_a_late_one_pending(demand_time, hits, pending):
    cache = make_cache(fill_latency_rounds=1)
    assert read(cache, 5, kind=PREFETCH, time=0).prefetch_misses == 4
    demand = read(cache, 5, time=demand_time)
    assert (demand.demand_hits, demand.demand_pending, demand.demand_misses) == (hits, pending, 0)
    assert (demand.prefetch_used, demand.prefetch_late, demand.dram_bytes) == (4, pending, 0)


def test_a_prefetch_of_a_sector_in_flight_adds_nothing():
    cache = make_cache(fill_latency_rounds=1)
    read(cache, 2, time=0)
    prefetch = read(cache, 2, kind=PREFETCH_LINES, time=0.5)
    assert (prefetch.prefetch_hits, prefetch.prefetch_misses, prefetch.dram_bytes) == (4, 0, 0)
    demand = read(cache, 2, time=1)  # ready when the demand fill is: the prefetch moved nothing
    assert (demand.demand_hits, demand.prefetch_used) == (4, 0)


def test_an_evicted_pending_sector_misses_again():
    cache = make_cache(fill_latency_rounds=10)  # lines 0, 4, 8 share set 0 (2 ways)
    read(cache, 0, time=0)
    read(cache, 0, kind=PREFETCH, time=0)  # a no-op: the demand fill is in flight
    assert read(cache, 4, kind=PREFETCH, sector=1, time=0).prefetch_misses == 1
    evicting = read(cache, 8, time=1)  # line 0's fill is dropped with it
    assert (evicting.demand_misses, evicting.prefetch_evicted_unused) == (4, 0)
    again = read(cache, 0, time=2)  # line 4 leaves, its prefetch in flight and unused
    assert (again.demand_misses, again.demand_pending, again.dram_bytes) == (4, 0, 128)
    assert again.prefetch_evicted_unused == 1


def make_spec(**fields) -> TraceSpec:
    """A small vllm_v1 step: 2 sequences of 4,096 tokens, 8:2 heads, 8 CTA slots."""
    defaults = dict(family="vllm_v1", num_seqs=2, context=4096, num_qo_heads=8, num_kv_heads=2,
                    partition_size=0, ctas_per_sm=2, num_sms=4)
    return TraceSpec(**{**defaults, **fields})


@pytest.mark.parametrize("latency", [0.0, 0.5, 1.0, 4.0])
def test_gqa_siblings_in_lockstep_read_pending_fills(latency):
    spec = make_spec(jitter_rounds=0)  # a group's 4 query heads: CTAs in one round, a tile a turn
    result = simulate(spec, L2Cache(fill_latency_rounds=latency))
    assert result.dram_bytes == 2 * spec.v_base  # the first sibling's fill serves them all
    siblings = result.demand_sectors * 3 // 4
    expected = (siblings, 0) if latency == 0 else (0, siblings)
    assert (result.demand_hits, result.demand_pending) == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_siblings_apart_by_more_than_the_latency_hit(seed):
    spec = make_spec(num_seqs=1, context=256, num_qo_heads=2, num_kv_heads=1, num_sms=1,
                     jitter_rounds=1.0, seed=seed)  # 2 CTAs, 2 slots: the same tiles, one round
    gap = abs(np.diff(cta_phases(spec))[0])
    assert 0 < gap < 1
    for latency, later in [(gap / 2, "hits"), (gap, "hits"), ((gap + 1) / 2, "pending")]:
        result = simulate(spec, L2Cache(fill_latency_rounds=latency))
        half = result.demand_sectors // 2  # the earlier CTA misses every sector
        assert result.demand_misses == half
        expected = (half, 0) if later == "hits" else (0, half)
        assert (result.demand_hits, result.demand_pending) == expected


def sibling_hit_rate(spec: TraceSpec, latency: float) -> float:
    """By hand, for vllm_v1 CTAs that all start in round 0 and read the same number of sectors:
    in each group of siblings (head fastest) the earliest phase misses and a sibling hits iff it
    comes at least `latency` after it."""
    group = spec.num_qo_heads // spec.num_kv_heads
    phases = cta_phases(spec).reshape(-1, group)
    later = phases - phases.min(axis=1, keepdims=True) >= latency
    later[np.arange(len(phases)), phases.argmin(axis=1)] = False
    return later.mean()


def test_with_phases_the_sibling_hit_rate_falls_steadily_with_the_latency():
    spec = make_spec(num_sms=8, jitter_rounds=1.0)  # all 16 CTAs in round 0, 4 groups of 4
    latencies = [0.0, 0.125, 0.25, 0.5, 0.75, 1.0]
    rates = [simulate(spec, L2Cache(fill_latency_rounds=latency)).hit_rate
             for latency in latencies]
    assert rates == [sibling_hit_rate(spec, latency) for latency in latencies]
    assert rates[0] == 3 / 4 and rates[-1] == 0.0
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
    assert len(set(rates)) == len(rates)  # no jump from 3/4 to 0: every step in between


@pytest.mark.parametrize("jitter_rounds", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("family", ["vllm_v1", "gqa"])
def test_a_trace_with_phases_matches_the_reference(jitter_rounds, family):
    spec = make_spec(family=family, context=200, prefetch=PrefetchConfig("bulk"),
                     jitter_rounds=jitter_rounds, num_qo_heads=4)
    trace = requests(spec)
    result = simulate(spec, L2Cache(64, 4, fill_latency_rounds=0.3))
    assert result == reference(*trace, 64, 4, "hash", 0.3)
    assert (result.demand_pending > 0) == (family == "vllm_v1")  # gqa: no sibling reuse


@pytest.mark.parametrize(("distance", "latency", "late"), [(1, 0.5, False), (1, 1.0, False),
                                                           (1, 1.5, True), (2, 2.0, False)])
def test_a_prefetch_lands_if_its_distance_covers_the_latency(distance, latency, late):
    spec = make_spec(num_qo_heads=2, prefetch=PrefetchConfig("bulk", distance=distance))
    result = simulate(spec, L2Cache(fill_latency_rounds=latency))  # MHA: no sibling reuse
    assert result.prefetch_used == result.prefetch_misses > 0
    assert result.prefetch_late == (result.prefetch_used if late else 0)
    assert result.demand_hits == (0 if late else result.prefetch_used)
    # each CTA's first distance * NUM_WARPS blocks of K and of V are not prefetched
    head_start = 2 * spec.num_seqs * spec.num_qo_heads * distance * NUM_WARPS * spec.tile_bytes
    assert result.demand_misses * SECTOR_BYTES == head_start


def test_a_next_layer_starts_once_the_fills_have_landed():
    spec = make_spec(context=256)
    cache = L2Cache(fill_latency_rounds=4)
    first = simulate(spec, cache)
    assert first.demand_pending > 0 and cache.time > 0
    second = simulate(spec, cache)  # the same blocks, all resident and ready
    assert second.hit_rate == 1.0 and second.demand_pending == 0


@pytest.mark.parametrize("value", [-0.5, float("nan"), float("inf"), True, "1"])
def test_bad_fill_latency(value):
    message = f"fill_latency_rounds={value!r}: must be a finite number >= 0"
    with pytest.raises(ValueError, match=re.escape(message)):
        L2Cache(fill_latency_rounds=value)


@pytest.mark.parametrize(("times", "message"), [
    ([2.0, 1.0], "times[1]=1.0: must be finite and >= 2.0"),
    ([4.0, float("nan")], "times[1]=nan: must be finite"),
    ([0.5, 6.0], "times[0]=0.5: must be finite and >= 1.0 (the time before it"),
    ([True, True], "times: dtype=bool, shape=(2,): must be a number or a real array of shape"),
    ([1.0], "times: dtype=float64, shape=(1,)"),
])
def test_bad_times_leave_the_cache_unchanged(times, message):
    cache, untouched = make_cache(fill_latency_rounds=2), make_cache(fill_latency_rounds=2)
    for c in (cache, untouched):
        read(c, 0, 4, time=1)
    with pytest.raises(ValueError, match=re.escape(message)):
        cache.access([0, 128], 128, DEMAND, times)
    assert cache.time == untouched.time == 3.0
    probe = [0, 8, 4, 1]
    assert read(cache, *probe, time=2) == read(untouched, *probe, time=2)
