"""kvlab.sim: what the L2 counters would say, predicted on the CPU (no GPU needed).

`simulate(spec)` replays one decode step's address stream (kvlab.sim.trace) through a model of
the H200's L2 (kvlab.sim.l2) and returns an L2Result: sector hits, pending hits (fills still in
flight) and misses of loads and of prefetches, the hit rate and the DRAM bytes. Time is counted
in rounds of the schedule (kvlab.sim.spec), each CTA shifted by its phase
(TraceSpec.jitter_rounds); L2Cache(fill_latency_rounds=...) sets how long a fill
takes. Numba compiles the loops on first use (seconds; cached on disk), not at import.
`kvlab.sim.sample` replays a launch too big to replay live as a miniature of it: some of its
sequences on a share of the SMs and of the L2.
"""

from kvlab.sim.l2 import L2Cache, L2Result
from kvlab.sim.spec import TraceSpec, check_spec
from kvlab.sim.trace import iter_requests

__all__ = ["L2Cache", "L2Result", "TraceSpec", "simulate"]


def simulate(spec: TraceSpec, cache: L2Cache | None = None) -> L2Result:
    """Replays one decode step of `spec` through `cache` (default: an empty H200 L2, as after
    the benchmarks' flush, with the default fill latency) and returns what it did. A given cache
    keeps its contents, so consecutive calls model consecutive layers or steps sharing the L2;
    each starts at `cache.time`, once the fills of the one before have landed. Raises ValueError
    for a spec that is not a TraceSpec or a cache that is not an L2Cache (TraceSpec bounds the
    trace's memory: kvlab.sim.spec.MAX_TRACE_BYTES)."""
    check_spec(spec)
    if cache is not None and not isinstance(cache, L2Cache):
        raise ValueError(f"cache={cache!r}: must be a kvlab.sim.L2Cache or None")
    cache = L2Cache() if cache is None else cache
    result, start = L2Result(), cache.time
    for addrs, nbytes, kinds, times in iter_requests(spec):
        result += cache.access(addrs, nbytes, kinds, start + times)
    return result
