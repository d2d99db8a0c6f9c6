"""A replay of one decode launch bounded in work: a miniature of the launch (`sample_launch`),
replayed (`replay`) for an estimate of the whole launch's counts.

A launch's (sequence, KV head) pairs read blocks no other pair reads: each pair's L2 traffic is
the same stream, and pairs meet only in the L2's capacity. The miniature replays some of the
pairs (whole sequences while one fits the budget, else KV heads of one, each with its query
heads), planned as the whole launch is (partition size, warps, CTAs an SM), on about the same
share of the SMs, and an L2 of as many sets as keep each SM's share of the L2: so each round
asks as much of each set as the whole launch's rounds do, and prefetched lines leave the L2 as
early. The hit rates are the miniature's; they carry the noise of its fewer CTAs' phases
(kvlab.sim.spec.cta_phases: query heads of one KV head hit each other by their phases, so
vllm_v1's hit rate without prefetch moves by some points with the sample).
"""

import functools
import math
from dataclasses import dataclass, fields, replace

from kvlab.checks import check_int
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim import simulate
from kvlab.sim.l2 import L2_BYTES, LINE_BYTES, NUM_WAYS, SECTOR_BYTES, L2Cache, L2Result
from kvlab.sim.plan import launch_plan, launch_shape
from kvlab.sim.spec import TraceSpec

__all__ = ["Sample", "replay", "sample_launch"]

REPLAYS_KEPT = 32  # `replay`'s answers kept: an L2Result each


@dataclass(frozen=True)
class Sample:
    """What `sample_launch` replays of a launch.

    spec: the TraceSpec replayed: spec.num_seqs of the launch's `batch` sequences, spec's KV
        heads of its `num_kv_heads` (each with its query heads), on spec.num_sms of its `num_sms`
        SMs, planned as the whole launch.
    num_sets: the L2 sets replayed: the GPU's, in proportion to the SMs replayed.
    batch, num_kv_heads, num_sms: the whole launch's.
    """

    spec: TraceSpec
    num_sets: int
    batch: int
    num_kv_heads: int
    num_sms: int

    @property
    def scale(self) -> float:
        """The launch's (sequence, KV head) pairs over the replayed ones: its bytes over the
        replay's."""
        return (self.batch * self.num_kv_heads) / (self.spec.num_seqs * self.spec.num_kv_heads)

    @property
    def whole(self) -> bool:
        """Whether the replay is the whole launch."""
        return self.scale == 1

    def describe(self) -> str:
        """What is replayed: "the whole launch", or e.g. "4 of 64 sequences on 8 of 132 SMs"
        ("1 of 4 sequences, 2 of 8 KV heads on ..." where one sequence is too many)."""
        if self.whole:
            return "the whole launch"
        part = f"{self.spec.num_seqs} of {self.batch} sequences"
        if self.spec.num_kv_heads < self.num_kv_heads:
            part += f", {self.spec.num_kv_heads} of {self.num_kv_heads} KV heads"
        return f"{part} on {self.spec.num_sms} of {self.num_sms} SMs"


def sample_launch(model: str, kernel: str, batch: int, context: int, num_sms: int,
                  prefetch: PrefetchConfig, max_sectors: int, l2_bytes: int = L2_BYTES,
                  **fields) -> Sample:
    """The Sample of the launch of `kvlab.sim.plan.launch_spec(model, kernel, batch, context,
    num_sms, prefetch, **fields)` on a GPU whose L2 holds l2_bytes (NUM_WAYS ways of LINE_BYTES
    lines), whose loads read at most max_sectors sectors, or one (sequence, KV head) pair's
    where that is more: the whole launch where it fits. Raises ValueError as launch_spec (for
    the shape of one sequence: a trace too big for MAX_TRACE_BYTES too), for batch or num_sms
    not an integer >= 1, max_sectors not an integer >= 1, and l2_bytes not an integer of at
    least one set (NUM_WAYS x LINE_BYTES)."""
    check_int("max_sectors", max_sectors, 1)
    check_int("l2_bytes", l2_bytes, NUM_WAYS * LINE_BYTES)
    one = launch_shape(model, kernel, 1, context, 1, prefetch, **fields)
    check_int("batch", batch, 1)
    check_int("num_sms", num_sms, 1)
    batch, num_sms, num_kv_heads = int(batch), int(num_sms), one.num_kv_heads
    group = one.num_qo_heads // num_kv_heads
    pair = replace(one, num_qo_heads=group, num_kv_heads=1)
    num_pairs = batch * num_kv_heads
    pairs = max(1, min(num_pairs, int(max_sectors) * SECTOR_BYTES // pair.load_bytes))
    num_seqs, heads = ((pairs // num_kv_heads, num_kv_heads) if pairs >= num_kv_heads
                       else (1, pairs))
    plan = launch_plan(model, kernel, batch, context, num_sms)
    sms = _replayed_sms(num_sms, num_seqs * heads / num_pairs, plan["ctas_per_sm"],
                        group if kernel == "vllm_v1" else 1)
    spec = replace(one, num_seqs=num_seqs, num_qo_heads=group * heads, num_kv_heads=heads,
                   num_sms=sms, **plan)
    num_sets = int(l2_bytes) // (NUM_WAYS * LINE_BYTES)
    return Sample(spec, max(1, round(num_sets * sms / num_sms)), batch, num_kv_heads, num_sms)


def _replayed_sms(num_sms: int, share: float, ctas_per_sm: int, group: int) -> int:
    """The SMs that run `share` of a launch's CTAs as num_sms SMs run them all: about that share
    of num_sms, with as many CTA slots as the GPU's modulo `group` (vllm_v1 runs a KV head's
    `group` query heads as consecutive CTAs: each wave of slots then starts at the same query
    head of a group as on the GPU, and a group splits across waves alike)."""
    step = group // math.gcd(ctas_per_sm, group)
    first = num_sms % step or step  # the fewest SMs whose slots match the GPU's modulo group
    return min(range(first, num_sms + 1, step), key=lambda n: abs(n - num_sms * share))


def replay(sample: Sample) -> L2Result:
    """The launch's L2Result as the replay of `sample` (on an empty L2 of its sets, the default
    fill latency) estimates it: the replay's counts times `sample.scale`, rounded; its rates are
    the replay's. The last REPLAYS_KEPT samples' answers are kept (a dashboard goes back and
    forth). Raises ValueError for a `sample` that is not a Sample."""
    if not isinstance(sample, Sample):
        raise ValueError(f"sample={sample!r}: must be a kvlab.sim.sample.Sample")
    return _replay(sample)


@functools.lru_cache(maxsize=REPLAYS_KEPT)
def _replay(sample: Sample) -> L2Result:
    result = simulate(sample.spec, L2Cache(num_sets=sample.num_sets))
    return L2Result(*(round(getattr(result, f.name) * sample.scale) for f in fields(result)))
