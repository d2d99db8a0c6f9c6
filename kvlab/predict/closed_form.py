"""The closed form of one decode launch's time: what it reads and how its CTAs fill the SMs
(`launch`, from a LaunchPoint and the kernels' own plans in kvlab.kernels.geometry), and the
time from a few constants per kernel family (`FamilyFit`, fitted by kvlab.predict.fit):

    time = launch_us + merge_us [if split] + (t_hbm^p + t_l2^p + t_sm^p)^(1/p)

    t_hbm = DRAM bytes / (efficiency x copy roofline of the launch's SMs)
    t_l2  = K+V x kappa x (group - 1) / L2 rate       (vllm_v1: the other query heads of a
            group re-read their KV head; kappa, the share L1 does not catch, is ncu's)
    t_sm  = the busiest SM's tokens x 2 x head_dim / (its CTAs x a lone CTA's rate, at most an
            SM's rate); each CTA's fixed cost counted as `cta_tokens` more tokens

DRAM bytes: K+V once, the block tables, q and out, and a split launch's partial outputs
(written, then read by the merge). The busiest SM's tokens follow the plan: equal lengths fill
waves of num_sms x CTAs-an-SM slots, a partial wave costing a whole one; mixed lengths spread
their tokens over the SMs, at least the longest CTA's (gqa launches longest first; vllm_v1 in
grid order, so its tail adds half the longest). The soft maximum (p) blends the three where
they are close. Prefetch multiplies the SMs' rates by `lift` (latency hidden) and the HBM and
L2 rates by `tax` (the prefetches' own traffic and issue slots).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from kvlab.arith import ceil_div
from kvlab.gpus import GPUS, REFERENCE
from kvlab.gpus import copy_roofline_gbps as spec_roofline_gbps
from kvlab.kernels.geometry import (
    PARTITION_SIZE,
    VLLM_CTAS_PER_SM,
    ctas_per_sm,
    split_plan,
    use_partitions,
)
from kvlab.predict.point import DTYPE_BYTES, Q_BYTES, LaunchPoint
from kvlab.sim.time_model import copy_roofline_gbps

# a split CTA's partial output a query head: fp32 a head_dim element, and its max and sum
PARTIAL_EXTRA_BYTES = 8


@dataclass(frozen=True)
class Launch:
    """What the closed form needs of one launch (floats, so that many stack into arrays).

    kv_bytes: K+V read once. dram_bytes: what HBM serves (see the module doc). reuse_bytes:
    vllm_v1's K+V re-read by the group's other query heads (x kappa by `time_s`).
    busy_tokens, busy_ctas: the busiest SM's tokens and CTAs, as max(busy_tokens[i] +
    busy_ctas[i] x cta_tokens) over two readings (mixed lengths: the mean, the longest).
    conc: CTAs an SM runs at once (8-warp CTAs count as two). elements: 2 x head_dim.
    split: 1.0 where a merge runs. roofline_gbps: the copy roofline on the launch's SMs.
    clock: the GPU's boost clock over the reference's. l2_scale: its L2 rate over the
    reference's, taken as its L2 size (its slices) x clock. partitioned: vllm_v1's v2
    (partitions of 512 tokens).
    """

    kv_bytes: float
    dram_bytes: float
    reuse_bytes: float
    busy_tokens: tuple[float, float]
    busy_ctas: tuple[float, float]
    conc: float
    elements: float
    split: float
    roofline_gbps: float
    clock: float
    l2_scale: float
    partitioned: bool


@dataclass(frozen=True)
class FamilyFit:
    """One kernel family's constants (see the module doc): launch_us, merge_us (us); efficiency
    (of the copy roofline); lone_gelems, sm_gelems (G elements/s of a lone CTA, of an SM);
    cta_tokens; p (the soft maximum's power, > 1); l2_tbps (the L2's rate for re-reads, TB/s;
    0 where the family re-reads nothing); kappa {"v1"|"v2": {"none"|"prefetch": share}};
    prefetch {label: (lift, tax)}."""

    launch_us: float
    merge_us: float
    efficiency: float
    lone_gelems: float
    sm_gelems: float
    cta_tokens: float
    p: float
    l2_tbps: float
    kappa: dict
    prefetch: dict

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, values: dict) -> FamilyFit:
        """From `as_dict`'s dict, as JSON keeps it (ValueError for another shape)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(values, dict) or set(values) != names:
            raise ValueError(f"fit={values!r}: must be a dict of {sorted(names)}")
        return cls(**{**values, "prefetch": {k: tuple(v) for k, v in values["prefetch"].items()}})


def sm_roofline_gbps(gpu, num_sms: int, by_sms: dict[int, float]) -> float:
    """The copy roofline (GB/s) on num_sms SMs of `gpu`. The reference's (the H200's) is
    measured at the SM counts `by_sms` and interpolated between them
    (kvlab.sim.time_model.copy_roofline_gbps). Another GPU's is an assumption: its roofline
    (kvlab.gpus: the H200's measured share of its spec) times the share of the H200's roofline
    that the same fraction of the H200's SMs reached."""
    if gpu.key == REFERENCE:
        return copy_roofline_gbps(num_sms, by_sms)
    ref = GPUS[REFERENCE]
    share = (copy_roofline_gbps(max(1, round(num_sms * ref.num_sms / gpu.num_sms)), by_sms)
             / copy_roofline_gbps(ref.num_sms, by_sms))
    return spec_roofline_gbps(gpu)[0] * share


def _cta_tokens(lens: np.ndarray, part: int) -> tuple[int, int, int]:
    """(CTAs a KV or query head, their tokens, the longest CTA's tokens) of the sequences `lens`
    cut into partitions of `part` tokens (0: whole)."""
    count = np.maximum(1, ceil_div(lens, part)) if part else np.ones_like(lens)
    return int(count.sum()), int(lens.sum()), int(min(part, lens.max()) if part else lens.max())


def launch(point: LaunchPoint, by_sms: dict[int, float]) -> Launch:
    """The Launch of `point`, planned as the kernels plan it (vllm_v1: vLLM's v1/v2 rule; gqa:
    split_plan's partitions and warps on the point's SMs); by_sms: the reference GPU's copy
    roofline measured on some SM counts ({SMs: GB/s})."""
    lens, sms = point.lens(), point.num_sms
    kv_bytes = DTYPE_BYTES[point.dtype]
    equal = point.seq_lens is None or lens.min() == lens.max()
    if point.family == "vllm_v1":
        part = PARTITION_SIZE if use_partitions(point.batch, point.num_qo_heads,
                                                point.context) else 0
        slots, warps, heads = VLLM_CTAS_PER_SM, 4, point.num_qo_heads
    else:
        size, warps = split_plan(point.batch, point.num_kv_heads, point.context, sms,
                                 ctas_per_sm(point.head_dim, kv_bytes),
                                 2 * point.head_dim * kv_bytes, None if equal else lens.tolist(),
                                 eight_warps=ctas_per_sm(point.head_dim, kv_bytes, 8) >= 1)
        part = 0 if size >= point.context else size
        slots, heads = ctas_per_sm(point.head_dim, kv_bytes, warps), point.num_kv_heads
    num_ctas, tokens, longest = _cta_tokens(lens, part)
    num_ctas, tokens = num_ctas * heads, tokens * heads
    per_sm = ceil_div(num_ctas, sms)
    conc = min(slots, per_sm)
    if equal:  # waves of equal CTAs; a partial wave costs a whole one
        waves = ceil_div(num_ctas, sms * slots)
        n = per_sm if waves == 1 else waves * slots
        busy_tokens, busy_ctas = (n * longest,) * 2, (n,) * 2
    else:  # spread over the SMs, at least the longest CTA (and half of it in grid order)
        tail = 0.5 if point.family == "vllm_v1" else 0.0
        busy_tokens = (tokens / sms + tail * conc * longest, conc * longest)
        busy_ctas = (num_ctas / sms + tail * conc, conc)
    split = bool(part) and bool((lens > part).any())
    partial = point.head_dim * 4 + PARTIAL_EXTRA_BYTES  # one (sequence, partition, query head)
    partials = (num_ctas // heads) * point.num_qo_heads * partial if split else 0
    q_out = 2 * point.batch * point.num_qo_heads * point.head_dim * Q_BYTES
    tables = int(ceil_div(lens, point.block_size).sum()) * 4
    g, ref = point.gpu, GPUS[REFERENCE]
    roofline = sm_roofline_gbps(g, sms, by_sms)
    kv = point.kv_bytes
    return Launch(
        kv_bytes=float(kv), dram_bytes=float(kv + tables + q_out + 2 * partials),
        reuse_bytes=float(kv * (point.group - 1)) if point.family == "vllm_v1" else 0.0,
        busy_tokens=tuple(map(float, busy_tokens)), busy_ctas=tuple(map(float, busy_ctas)),
        conc=float(2 if warps == 8 else conc), elements=2.0 * point.head_dim,
        split=float(split), roofline_gbps=float(roofline), clock=g.boost_mhz / ref.boost_mhz,
        l2_scale=g.l2_bytes * g.boost_mhz / (ref.l2_bytes * ref.boost_mhz),
        partitioned=bool(part))


def stack(launches: list[Launch]) -> dict[str, np.ndarray]:
    """The launches' fields as arrays (busy_* as two columns each), for `time_s`."""
    return {f.name: np.array([getattr(x, f.name) for x in launches], dtype=float)
            for f in fields(Launch)}


def time_s(x: dict, fit: FamilyFit, prefetch: str = "none") -> np.ndarray:
    """The closed form's time (s) of the stacked launches `x` (`stack`) under `fit`, with the
    prefetch setting `prefetch` (a label of fit.prefetch, or "none")."""
    lift, tax = (1.0, 1.0) if prefetch == "none" else fit.prefetch[prefetch]
    t_hbm = x["dram_bytes"] / (fit.efficiency * tax * x["roofline_gbps"] * 1e9)
    tokens = np.maximum(x["busy_tokens"][..., 0] + x["busy_ctas"][..., 0] * fit.cta_tokens,
                        x["busy_tokens"][..., 1] + x["busy_ctas"][..., 1] * fit.cta_tokens)
    rate = lift * x["clock"] * 1e9 * np.minimum(x["conc"] * fit.lone_gelems, fit.sm_gelems)
    t_sm = tokens * x["elements"] / rate
    total = t_hbm ** fit.p + t_sm ** fit.p
    if fit.l2_tbps:
        which = "none" if prefetch == "none" else "prefetch"
        kappa = np.where(x["partitioned"] > 0, fit.kappa["v2"][which], fit.kappa["v1"][which])
        total = total + (x["reuse_bytes"] * kappa / (fit.l2_tbps * tax * x["l2_scale"] * 1e12)
                         ) ** fit.p
    return (fit.launch_us + x["split"] * fit.merge_us) * 1e-6 + total ** (1 / fit.p)

