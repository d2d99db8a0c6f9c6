"""The cross-kernel prefetch learned from its recordings: how much of `kvlab.predict.step`'s bound
a GPU keeps.

`step.step_anatomy` bounds what `kvlab.LLM(ahead_bytes=...)` can win: every prefetched byte is
found in L2 by the GEMM after, and moved while HBM would idle. Two measured quantities say how
much of that holds:

- delivery: the share of the prefetched bytes a GEMM finds in L2. ncu's share of the GEMM's
  loaded bytes that hit L2 with the prefetch, less without it, over the share `step.ahead_hits`
  says the prefetch brings (the counters of `python -m kvlab bench steptrace --counters`),
  median per regime: the streaming linears (at most STREAMING_ROWS sequences: layer_ops'
  kernels, which also issue the prefetch), cuBLAS's GEMMs whose weight fits in L2, and those
  whose weight does not;
- issue cost: the time the kernel that issues a prefetch grows by, as a share of the prefetched
  bytes at the copy roofline, one per regime (streaming, cuBLAS), fitted by least squares on the
  steps recorded with the lever off and on in one loop (`bench e2e`'s gqa and gqa+ahead).

`ahead_effect` predicts a step's change with the prefetch: the issue cost of each prefetch,
less the idle each covered GEMM hides (its delivered bytes at the copy roofline, at most one
kernel's overhead). `fit_ahead` checks it on each model left out of the cost fit in turn.

The prefetch of each layer's K/V blocks by its QKV linear (`kvlab.LLM(ahead_kv_bytes=...)`)
moves the attention's reads into that linear's drain, where HBM is still busy. `fit_kv_ahead`
learns what that nets, per GPU: a step's change as a share of the prefetched bytes' time at the
copy roofline (`net_cost`; > 0 slower), by least squares on the steps recorded with it off and
on in one loop (bench e2e's gqa and gqa+ahead_kv, KV_RECORDED), checked on each model left
out in turn; `kv_ahead_effect` predicts a step's change from it. `kv_delivery` says what the
blocks' prefetch brings: ncu's share of the attention's loaded bytes that hit L2 with it, less
without, over the share of a layer's K and V it covers (KV_COUNTERS, bench steptrace
--ahead-kv-bytes 0 N --counters).
It is fitted per GPU, on that GPU's recordings (AHEAD_RECORDED); a GPU with no counters of its
own takes another's delivery, and a GPU with no recordings another's model, as the callers
state (`AheadModel.sources`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvlab.checks import check_int, check_real
from kvlab.config import MODELS
from kvlab.gpus import GPUS
from kvlab.predict.step import STREAMING_ROWS, VARIANT, StepModel, ahead_hits, fit_step_model
from kvlab.results import load_result

__all__ = ["AHEAD_RECORDED", "KV_COUNTERS", "KV_LEVER", "KV_RECORDED", "KV_RUNS", "LEVER",
           "LEVER_RUNS", "MIN_PREFETCHED_SHARE", "AheadModel", "HeldOut", "KvAheadModel",
           "ahead_effect", "counter_pairs", "fit_ahead", "fit_kv_ahead", "kv_ahead_effect",
           "kv_delivery", "kv_pairs", "lever_pairs", "regime"]

# The recordings each GPU's model learns from (kvlab.gpus key -> {"e2e": the lever off and on,
# bench e2e's gqa and gqa+ahead; "counters": one step with and without it, bench steptrace
# --counters}, each (machine, result names)). The H200 has no counters: the H100's delivery.
# The K/V blocks' prefetch's runs (bench e2e's gqa, gqa+ahead and gqa+ahead_kv in one loop),
# per GPU: (machine, result names).
KV_RECORDED = {"h100-sxm": ("h100", ("e2e_ahead_kv", "e2e_ahead_kv_4k")),
               "h200": ("h200", ("e2e_ahead_kv_32k", "e2e_ahead_kv_b2"))}
AHEAD_RECORDED = {
    "h100-sxm": {"e2e": ("h100", ("e2e_ahead", "e2e_ahead_4k", "e2e_ahead_32k",
                                  *KV_RECORDED["h100-sxm"][1])),
                 "counters": ("h100", ("steptrace_counters", "steptrace_4k_counters"))},
    "h200": {"e2e": ("h200", ("e2e_ahead_4k", "e2e_ahead_32k", *KV_RECORDED["h200"][1])),
             "counters": ("h100", ("steptrace_counters", "steptrace_4k_counters"))},
}
# the lever's runs, off and on in one loop, every GPU's: (kvlab.gpus key, machine, result name)
LEVER_RUNS = tuple((gpu, machine, name) for gpu, runs in AHEAD_RECORDED.items()
                   for machine, names in [runs["e2e"]] for name in names)
KV_RUNS = tuple((gpu, machine, name) for gpu, (machine, names) in KV_RECORDED.items()
                for name in names)
# one step under ncu without and with the K/V blocks' prefetch (bench steptrace --ahead-kv-bytes
# 0 N --counters): (machine, result names); an H100's
KV_COUNTERS = ("h100", ("steptrace_kv_counters",))
LEVER = VARIANT + "+ahead"  # bench e2e's variant with the prefetch of the weights
KV_LEVER = VARIANT + "+ahead_kv"  # and with the prefetch of the K/V blocks
LEVER_SIZES = {LEVER: "ahead_bytes", KV_LEVER: "ahead_kv_bytes"}  # a row's size of its lever
REGIMES = ("streaming", "fits", "exceeds")  # delivery: linear kind and weight against L2
# a GEMM whose modelled prefetched share is below this (the LM head's 1%) measures no delivery:
# its hits' rise is within the counters' noise
MIN_PREFETCHED_SHARE = 0.02


@dataclass(frozen=True, kw_only=True)
class HeldOut:
    """A learned model's fit and its check: the `steps` (lever pairs) it was fitted on, and over
    the models left out of the fit in turn, the largest and the median |predicted - recorded|
    change of a step (us) and the largest such miss over its step (`held_out_share`), with
    `checks` {"model", "batch", "prompt", "step_us" (without the lever), "recorded_us",
    "predicted_us"} per point; and `sources`, the recordings it learned from ("machine/name,
    ...", "" where given)."""

    steps: int = 0
    held_out_us: float = 0.0
    median_us: float = 0.0
    held_out_share: float = 0.0
    checks: tuple = ()
    sources: str = ""


def _held_out(checks: list[dict], sources: str) -> dict:
    """HeldOut's fields of `checks`, one per lever pair fitted."""
    misses = [abs(c["predicted_us"] - c["recorded_us"]) for c in checks]
    return {"steps": len(checks), "held_out_us": max(misses),
            "median_us": statistics.median(misses),
            "held_out_share": max(m / c["step_us"] for m, c in zip(misses, checks, strict=True)),
            "checks": tuple(checks), "sources": sources}


@dataclass(frozen=True)
class AheadModel(HeldOut):
    """The learned prefetch: `delivery` {regime: share of prefetched bytes found in L2} (REGIMES;
    a regime no counter measured is absent), `issue_cost` {"streaming", "cublas": share of the
    prefetched bytes' roofline time the issuing kernel grows by}, the L2 the regimes are split
    on (`l2_bytes`, the GPU's), the GEMMs' counter pairs it learned the delivery from (`gemms`),
    and HeldOut's fit and check of the issue cost."""

    delivery: dict
    issue_cost: dict
    l2_bytes: int
    gemms: int = 0


def regime(batch: int, weight_bytes: int, l2_bytes: int) -> str:
    """The delivery regime of a GEMM of `weight_bytes` at `batch` sequences on an L2 of
    `l2_bytes`: "streaming" (layer_ops' linear), else "fits" or "exceeds" (cuBLAS)."""
    if batch <= STREAMING_ROWS:
        return "streaming"
    return "fits" if weight_bytes <= l2_bytes else "exceeds"


def ahead_effect(model: str, batch: int, context: float, ahead_bytes: int, roofline_gbps: float,
                 step: StepModel, learned: AheadModel, l2_bytes: int | None = None) -> dict:
    """The change of one decode step of `model` at `batch` sequences of `context` tokens with the
    cross-kernel prefetch of `ahead_bytes`, on a GPU of copy roofline `roofline_gbps` (GB/s)
    and L2 `l2_bytes` (default learned.l2_bytes, the GPU learned on): {"cost_us" (the issuing
    kernels' growth), "hidden_us" (the idle the delivered bytes hide, at most step's overhead
    a kernel), "delta_us" (cost less hidden: > 0 slower), "bound_us" (step.step_anatomy's
    hidden bound)}. A regime the counters did not measure takes the median delivery of those
    measured. Raises ValueError as `step.ahead_hits`, for a roofline or L2 that is not a
    number > 0, and for a step or learned model of the wrong type or without a delivery."""
    check_int("batch", batch, 1)
    check_real("roofline_gbps", roofline_gbps, 0.0, open_min=True)
    if l2_bytes is None and isinstance(learned, AheadModel):
        l2_bytes = learned.l2_bytes
    check_int("l2_bytes", l2_bytes, 1)
    if (not isinstance(step, StepModel) or not isinstance(learned, AheadModel)
            or not learned.delivery):
        raise ValueError(f"step={step!r:.40}, learned={learned!r:.40}: must be a StepModel "
                         "(step.fit_step_model) and an AheadModel with a delivery (fit_ahead)")
    gbps = float(roofline_gbps)
    overhead = step.streaming_overhead_us if batch <= STREAMING_ROWS else step.overhead_us
    fallback = statistics.median(learned.delivery.values())
    cost = learned.issue_cost["streaming" if batch <= STREAMING_ROWS else "cublas"]
    totals = {"cost_us": 0.0, "hidden_us": 0.0, "bound_us": 0.0}
    for _, weight, prefetched in ahead_hits(model, batch, context, ahead_bytes, l2_bytes):
        if not prefetched:
            continue
        moved_us = prefetched / gbps / 1e3
        delivery = learned.delivery.get(regime(batch, weight, l2_bytes), fallback)
        totals["cost_us"] += cost * moved_us
        totals["hidden_us"] += min(overhead, delivery * moved_us)
        totals["bound_us"] += min(overhead, moved_us)
    return {**totals, "delta_us": totals["cost_us"] - totals["hidden_us"]}


def lever_pairs(result: dict, without: str = VARIANT, lever: str = LEVER) -> list[tuple]:
    """(the row of `without`, the row of `lever` at the same model, batch and prompt) of a bench
    e2e result, for each `lever` row with a prefetch (its LEVER_SIZES size > 0) on one GPU (no
    tensor parallelism), in the order recorded."""
    rows = [r for r in result["rows"] if r.get("tp", 1) == 1]
    base = {(r["model"], r["batch"], r["prompt"]): r for r in rows if r["variant"] == without}
    size = LEVER_SIZES.get(lever, "ahead_bytes")
    return [(base[key], r) for r in rows
            if r["variant"] == lever and r.get(size)
            and (key := (r["model"], r["batch"], r["prompt"])) in base]


def counter_pairs(result: dict) -> list[tuple[dict, dict]]:
    """(the row without the cross-kernel prefetch, one with it at the same model, batch and
    prompt, of the same recording where rows are merged from several: their "source") of a
    bench steptrace --counters result, where ncu gave the GEMMs' counters (the K/V blocks'
    prefetch's rows left out: kv_pairs'), in the order recorded."""
    rows = [r for r in result["rows"] if (r.get("counters") or {}).get("gemms")
            and not r.get("ahead_kv_bytes")]
    key = ("model", "batch", "prompt", "source")
    without = {tuple(r.get(k) for k in key): r for r in rows if not r["ahead_bytes"]}
    return [(base, r) for r in rows if r["ahead_bytes"]
            and (base := without.get(tuple(r.get(k) for k in key))) is not None]


def _delivery_points(counters: list[dict], l2_bytes: int) -> list[tuple[str, float]]:
    """(regime, delivered share) of each GEMM that a prefetch covered by MIN_PREFETCHED_SHARE
    or more in the counter recordings: its L2 hit share with the prefetch less without, over
    the share the prefetch brings. Raises ValueError for a GEMM the step model does not have."""
    points = []
    for result in counters:
        for without, r in counter_pairs(result):
            base = {g["name"]: g for g in without["counters"]["gemms"]}
            weights = {name: weight for name, weight, _ in ahead_hits(r["model"], r["batch"],
                                                                      r["prompt"], 0)}
            for g in r["counters"]["gemms"]:
                if g["name"] not in weights:
                    raise ValueError(f"counters: GEMM {g['name']!r} of {r['model']}: not one of "
                                     f"the step model's {sorted(weights)}")
                before = base.get(g["name"], {}).get("load_hit_share")
                if (g["prefetched_share"] >= MIN_PREFETCHED_SHARE
                        and None not in (before, g["load_hit_share"])):
                    points.append((regime(r["batch"], weights[g["name"]], l2_bytes),
                                   (g["load_hit_share"] - before) / g["prefetched_share"]))
    return points


def _lever_points(e2e: list[dict]) -> list[dict]:
    """Each recorded pair of steps without and with the lever (`lever_pairs`): model, batch,
    prompt, mean context, ahead_bytes, the step without (us), the recorded change (us) and its
    run's copy roofline."""
    return [{"model": base["model"], "batch": base["batch"], "prompt": base["prompt"],
             "context": base["prompt"] + base["new_tokens"] / 2,
             "ahead_bytes": lever["ahead_bytes"], "step_us": 1e3 * base["step_ms"],
             "delta_us": 1e3 * (lever["step_ms"] - base["step_ms"]),
             "roofline_gbps": result["roofline_copy_gbps"]}
            for result in e2e for base, lever in lever_pairs(result)]


def _fit_costs(points: list[dict], step: StepModel, delivery: dict, l2_bytes: int) -> dict:
    """The issue cost per regime ("streaming", "cublas") fitting the points' recorded changes
    by least squares, one coefficient each (0 where no point is of that regime)."""
    unit = AheadModel(delivery, {"streaming": 1.0, "cublas": 1.0}, l2_bytes)
    sums = {"streaming": [0.0, 0.0], "cublas": [0.0, 0.0]}
    for p in points:
        effect = ahead_effect(p["model"], p["batch"], p["context"], p["ahead_bytes"],
                              p["roofline_gbps"], step, unit)
        moved = effect["cost_us"]  # at a cost of 1: the prefetched bytes' time
        key = "streaming" if p["batch"] <= STREAMING_ROWS else "cublas"
        sums[key][0] += moved * (p["delta_us"] + effect["hidden_us"])
        sums[key][1] += moved * moved
    return {key: num / den if den else 0.0 for key, (num, den) in sums.items()}


def _results(name: str, given, recorded: tuple[str, tuple[str, ...]]) -> tuple[list, list]:
    """The bench results a fit learns from, and the recordings they are ("machine/name"): the
    argument `name`'s `given` list (no recordings), or where None the `recorded` (machine,
    result names). Raises ValueError for results that are not a list of bench results (each
    with rows)."""
    machine, names = recorded
    results, named = ((given, []) if given is not None else
                      ([load_result(machine, n) for n in names], [f"{machine}/{n}" for n in names]))
    if not isinstance(results, list | tuple) or not all(
            isinstance(r, dict) and isinstance(r.get("rows"), list) for r in results):
        raise ValueError(f"{name}={results!r:.80}: must be a list of bench results (each with "
                         "rows)")
    return results, named


def fit_ahead(gpu: str = "h100-sxm", e2e=None, counters=None, step: StepModel | None = None,
              l2_bytes: int | None = None) -> AheadModel:
    """`AheadModel` of GPU `gpu` (a key of AHEAD_RECORDED) learned from its recordings, or from
    `e2e` (a list of bench e2e results with gqa and gqa+ahead rows) and `counters` (a list of
    bench steptrace --counters results) where given; its regimes split on `l2_bytes` (default
    the GPU's L2), on the step model `step` (default step.fit_step_model(), the H200's: its
    overhead a kernel caps what a prefetch hides), checked on each model left out of the cost
    fit. Raises ValueError for a gpu without recordings, lists that are not such results, or
    that hold no counter pair or lever pairs of fewer than two models."""
    if gpu not in AHEAD_RECORDED:
        raise ValueError(f"gpu={gpu!r}: no recordings of the cross-kernel prefetch; recorded: "
                         f"{list(AHEAD_RECORDED)}")
    e2e, named = _results("e2e", e2e, AHEAD_RECORDED[gpu]["e2e"])
    counters, named_counters = _results("counters", counters, AHEAD_RECORDED[gpu]["counters"])
    named += named_counters
    l2_bytes = GPUS[gpu].l2_bytes if l2_bytes is None else l2_bytes
    check_int("l2_bytes", l2_bytes, 1)
    step = fit_step_model() if step is None else step
    shares: dict[str, list[float]] = {}
    for key, share in _delivery_points(counters, l2_bytes):
        shares.setdefault(key, []).append(share)
    if not shares:
        raise ValueError("counters: no GEMM recorded without and with a prefetch: the delivery "
                         "needs one")
    delivery = {key: statistics.median(shares[key]) for key in REGIMES if key in shares}
    points = _lever_points(e2e)
    models = sorted({p["model"] for p in points})
    if len(models) < 2:
        raise ValueError(f"e2e: the recordings hold {VARIANT} and {LEVER} steps of "
                         f"{len(models)} model(s): the fit needs two or more, one to leave out")
    checks = []
    for left_out in models:
        learned = AheadModel(delivery, _fit_costs([p for p in points if p["model"] != left_out],
                                                  step, delivery, l2_bytes), l2_bytes)
        checks += [{"model": p["model"], "batch": p["batch"], "prompt": p["prompt"],
                    "recorded_us": p["delta_us"], "step_us": p["step_us"],
                    "predicted_us": ahead_effect(p["model"], p["batch"], p["context"],
                                                 p["ahead_bytes"], p["roofline_gbps"], step,
                                                 learned)["delta_us"]}
                   for p in points if p["model"] == left_out]
    return AheadModel(delivery, _fit_costs(points, step, delivery, l2_bytes), l2_bytes,
                      sum(map(len, shares.values())), **_held_out(checks, ", ".join(named)))


@dataclass(frozen=True)
class KvAheadModel(HeldOut):
    """The learned prefetch of the K/V blocks: `net_cost`, a step's change as a share of the
    prefetched bytes' time at the copy roofline (> 0 slower), and HeldOut's fit and check."""

    net_cost: float


def kv_pairs(result: dict) -> list[tuple[dict, dict]]:
    """(the row without the K/V blocks' prefetch, one with it at the same model, batch, prompt
    and ahead_bytes, of the same recording where rows are merged from several: their "source")
    of a bench steptrace --counters result, where ncu gave both the attention's L2 hits, in the
    order recorded."""
    rows = [r for r in result["rows"]
            if ((r.get("counters") or {}).get("attention") or {}).get("load_hit_share")
            is not None]
    key = ("model", "batch", "prompt", "ahead_bytes", "source")
    without = {tuple(r.get(k) for k in key): r for r in rows if not r.get("ahead_kv_bytes")}
    return [(base, r) for r in rows if r.get("ahead_kv_bytes")
            and (base := without.get(tuple(r.get(k) for k in key))) is not None]


def kv_delivery(counters: list[dict] | None = None) -> tuple[float, int, str]:
    """The share of the prefetched K/V bytes the attention finds in L2: the median over
    `kv_pairs` of the rise in ncu's share of its loaded bytes that hit L2, over the share of a
    layer's K and V the prefetch asks for (its "prefetched_share": ahead_kv_bytes over the
    layer's K and V, at most 1; the GEMMs' is the step model's); with the number of pairs and
    the recordings it came from ("machine/name, ...", "" where `counters` is given). Raises
    ValueError for a list that is not of bench results, or that holds no such pair."""
    counters, named = _results("counters", counters, KV_COUNTERS)
    shares = [(on["counters"]["attention"]["load_hit_share"]
               - base["counters"]["attention"]["load_hit_share"])
              / on["counters"]["attention"]["prefetched_share"]
              for result in counters for base, on in kv_pairs(result)
              if on["counters"]["attention"]["prefetched_share"] > 0]
    if not shares:
        raise ValueError("counters: no step recorded under ncu without and with the K/V blocks' "
                         "prefetch")
    return statistics.median(shares), len(shares), ", ".join(named)


def kv_moved_us(model: str, ahead_kv_bytes: int, roofline_gbps: float) -> float:
    """The time (us) `ahead_kv_bytes` of K/V a layer take at `roofline_gbps` (GB/s) over the
    layers of `model` (a kvlab.MODELS preset). Raises ValueError for a name not a preset, a size
    not an integer >= 0 or a roofline not a number > 0."""
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model={model!r}: must be one of {', '.join(MODELS)}")
    check_int("ahead_kv_bytes", ahead_kv_bytes, 0)
    check_real("roofline_gbps", roofline_gbps, 0.0, open_min=True)
    return MODELS[model].num_layers * ahead_kv_bytes / float(roofline_gbps) / 1e3


def kv_ahead_effect(model: str, ahead_kv_bytes: int, roofline_gbps: float,
                    learned: KvAheadModel) -> float:
    """The change (us; > 0 slower) of one decode step of `model` with `ahead_kv_bytes` of each
    layer's K/V prefetched, on a GPU of copy roofline `roofline_gbps`: learned.net_cost of the
    prefetched bytes' time (`kv_moved_us`). Raises ValueError as kv_moved_us, and for a learned
    model that is not a KvAheadModel."""
    if not isinstance(learned, KvAheadModel):
        raise ValueError(f"learned={learned!r:.40}: must be a KvAheadModel (fit_kv_ahead)")
    return learned.net_cost * kv_moved_us(model, ahead_kv_bytes, roofline_gbps)


def _net_cost(points: list[dict]) -> float:
    """The least-squares share c of delta_us = c * moved_us over the points."""
    return (sum(p["moved_us"] * p["delta_us"] for p in points)
            / sum(p["moved_us"] ** 2 for p in points))


def fit_kv_ahead(gpu: str, e2e: list[dict] | None = None) -> KvAheadModel:
    """The K/V blocks' prefetch of `gpu` (a KV_RECORDED key) learned from its recordings, or
    from `e2e` (bench e2e results) where given, checked on each model left out in turn. Raises
    ValueError for a gpu without recordings, lists that are not such results, or lever pairs of
    fewer than two models."""
    if gpu not in KV_RECORDED:
        raise ValueError(f"gpu={gpu!r}: no recordings of the K/V blocks' prefetch; recorded: "
                         f"{list(KV_RECORDED)}")
    e2e, named = _results("e2e", e2e, KV_RECORDED[gpu])
    points = [{"model": base["model"], "batch": base["batch"], "prompt": base["prompt"],
               "step_us": 1e3 * base["step_ms"],
               "delta_us": 1e3 * (lever["step_ms"] - base["step_ms"]),
               "moved_us": kv_moved_us(base["model"], lever["ahead_kv_bytes"],
                                       result["roofline_copy_gbps"])}
              for result in e2e for base, lever in lever_pairs(result, lever=KV_LEVER)]
    models = sorted({p["model"] for p in points})
    if len(models) < 2:
        raise ValueError(f"e2e: the recordings hold {VARIANT} and {KV_LEVER} steps of "
                         f"{len(models)} model(s): the fit needs two or more, one to leave out")
    # the net cost fitted without each model in turn
    without = {m: _net_cost([p for p in points if p["model"] != m]) for m in models}
    checks = [{"model": p["model"], "batch": p["batch"], "prompt": p["prompt"],
               "step_us": p["step_us"], "recorded_us": p["delta_us"],
               "predicted_us": without[left_out] * p["moved_us"]}
              for left_out in models for p in points if p["model"] == left_out]
    return KvAheadModel(_net_cost(points), **_held_out(checks, ", ".join(named)))
