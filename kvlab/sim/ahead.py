"""The cross-kernel prefetch in the L2 model: what share of a GEMM's weight its loads find in L2
after the kernel before it prefetched the weight's first bytes (`kvlab.LLM(ahead_bytes=...)`).

`ahead_hit_share` replays three phases through an L2Cache (kvlab.sim.l2), each once the fills
of the one before have landed: the prefetch of the weight's first `ahead_bytes` (one bulk
prefetch), the loads of `between_bytes` of other data (what runs in between: for W_O at one or
two sequences, the attention's K/V), then the GEMM's loads of the whole weight, in order. The
share is the GEMM's sectors that hit over all its sectors. Timing is left out: every prefetch
is in time, as under ncu, which runs the kernels one after another
(`kvlab.bench.stepcounters`). `kvlab.predict.step.ahead_hits` says the same with a rule (the
prefetch counts whole where the bytes in between and it fit in L2, else not at all); the tests
check the rule against this replay.
"""

from __future__ import annotations

from kvlab.checks import check_int
from kvlab.sim.l2 import DEMAND, MAX_REQUEST_BYTES, PREFETCH, L2Cache

OTHER_BASE = 1 << 40  # where the data read in between lies: apart from the weight's addresses


def ahead_hit_share(weight_bytes: int, ahead_bytes: int, between_bytes: int = 0,
                    cache: L2Cache | None = None) -> float:
    """The share of a GEMM's weight loads (`weight_bytes`, read whole) that hit L2 after its
    first `ahead_bytes` were prefetched and `between_bytes` of other data were read, on
    `cache` (default an empty H200 L2; a given one keeps what it holds). Raises ValueError for
    sizes that are not integers (weight_bytes >= 1, the others >= 0, each below 2**40) or a
    cache that is not an L2Cache."""
    check_int("weight_bytes", weight_bytes, 1, OTHER_BASE - 1)
    check_int("ahead_bytes", ahead_bytes, 0, OTHER_BASE - 1)
    check_int("between_bytes", between_bytes, 0, OTHER_BASE - 1)
    if cache is not None and not isinstance(cache, L2Cache):
        raise ValueError(f"cache={cache!r}: must be a kvlab.sim.L2Cache or None")
    cache = L2Cache() if cache is None else cache
    _read(cache, 0, min(ahead_bytes, weight_bytes), PREFETCH)
    _read(cache, OTHER_BASE, between_bytes, DEMAND)
    gemm = _read(cache, 0, weight_bytes, DEMAND)
    return gemm.demand_hits / gemm.demand_sectors


def _read(cache: L2Cache, base: int, nbytes: int, kind: int):
    """[base, base + nbytes) through `cache` as requests of `kind`, in order, in one phase."""
    starts = list(range(base, base + nbytes, MAX_REQUEST_BYTES))
    sizes = [min(MAX_REQUEST_BYTES, base + nbytes - s) for s in starts]
    return cache.access(starts, sizes, kind) if starts else None
