"""`decode_launch`: the time, GB/s and share of the copy roofline of one decode-attention launch
at any point, and how far to trust it (`Prediction`).

A recorded point answers with its recording. Elsewhere the closed form (kvlab.predict.closed_form)
answers with the constants fitted to the H200's recordings (benchmarks/results/cpu/predict.json,
written by benchmarks/predict_fit.py), labelled "interpolated" inside the recorded range of
every dimension and "extrapolated" beyond it, naming the dimensions; its error band is the
family's held-out 90th percentile (kvlab.predict.validate): one model out where interpolated,
the worst region held out where extrapolated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kvlab.checks import check_bool
from kvlab.gpus import REFERENCE
from kvlab.gpus import copy_roofline_gbps as spec_roofline_gbps
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.predict.closed_form import FamilyFit, launch, sm_roofline_gbps, stack, time_s
from kvlab.predict.point import LaunchPoint, launch_point
from kvlab.predict.recorded import FITTED, Recorded, measured
from kvlab.predict.validate import ALL
from kvlab.results import load_result

SOURCES = ("measured", "interpolated", "extrapolated")


@dataclass(frozen=True)
class Prediction:
    """One launch's answer. time_ms; gbps: K+V read once over the time; roofline_share: gbps over
    the GPU's copy roofline (the whole GPU's, as the recordings' pct_roofline); source: one of
    SOURCES; note: where the number comes from (the recording, or the model and what it assumes);
    error_band: (lo, hi) ms, the measured times the held-out 90th percentile allows (a measured
    point: the spread of its runs); extrapolated: the dimensions beyond the recorded range."""

    time_ms: float
    gbps: float
    roofline_share: float
    source: str
    note: str
    error_band: tuple[float, float]
    extrapolated: tuple[str, ...] = ()


@functools.cache
def fitted() -> dict:
    """predict.json's fit: {"fits": {family: FamilyFit}, "by_sms", "bands", "ranges"}.
    ValueError where it is not recorded or not of that shape."""
    result = load_result("cpu", "predict", keys={"fit": dict, "rooflines_by_sms": dict,
                                                 "bands": dict, "ranges": dict})
    return {"fits": {f: FamilyFit.from_dict(c) for f, c in result["fit"].items()},
            "by_sms": {int(k): v for k, v in result["rooflines_by_sms"].items()},
            "bands": result["bands"], "ranges": result["ranges"]}


def modelled_prefetch(fit: FamilyFit, prefetch: PrefetchConfig) -> str:
    """The fitted setting that stands for `prefetch`: itself where fitted; else the fitted one of
    its mode (or any mode) at the nearest distance (an evict-last hint and K or V alone are not
    modelled apart)."""
    label = prefetch.label()
    if label in fit.prefetch or label == "none":
        return label
    same = [lb for lb in fit.prefetch if lb.startswith(prefetch.mode)] or list(fit.prefetch)

    def distance(lb):
        return abs(math.log2(PrefetchConfig.from_label(lb).distance / prefetch.distance)), lb

    return min(same, key=distance)


def _outside(point: LaunchPoint, ranges: dict, label: str) -> dict[str, str]:
    """{dimension: "value; recorded range"} for what of `point` lies beyond its family's
    recorded range."""
    r = ranges[point.family]
    found = {}

    def span(name, value, recorded):
        if not recorded or not recorded[0] <= value <= recorded[1]:
            found[name] = (f"{value}; recorded {recorded[0]}-{recorded[1]}" if recorded
                           else f"{value}; none recorded")

    def member(name, value, recorded):
        if value not in recorded:
            found[name] = f"{value}; recorded {', '.join(map(str, recorded))}"

    span("batch", point.batch, r["batch"])
    if point.seq_lens is None:
        span("context", point.context, r["context"])
    else:
        span("lengths' longest", point.context, r["mixed_max"])
        span("lengths' mean", round(float(point.seq_lens.mean())), r["mixed_mean"])
    span("group", point.group, r["group"])
    span("num_kv_heads", point.num_kv_heads, r["num_kv_heads"])
    member("head_dim", point.head_dim, r["head_dim"])
    member("block_size", point.block_size, r["block_size"])
    member("dtype", point.dtype, r["dtype"])
    member("prefetch", label, r["prefetch"])
    if point.gpu.key != REFERENCE:
        found["gpu"] = f"{point.gpu.key}; recorded {REFERENCE}"
    else:
        span("num_sms", point.num_sms, r["num_sms"])
    return found


def _measured(recorded: Recorded, modelled_ms: float | None) -> Prediction:
    """The recording's answer; `modelled_ms`: the model's, for a recording of earlier kernels."""
    row = recorded.row
    runs = row.get("ms_runs") or [row["ms"]]
    note = recorded.label
    if modelled_ms is not None:
        note += (f"; by the kernels of that date (the closed form for today's: "
                 f"{modelled_ms:.4f} ms)")
    return Prediction(row["ms"], row["gbps"], row["pct_roofline"] / 100, "measured", note,
                      (min(runs), max(runs)))


def decode_launch(model_or_shape, batch: int, context: int | None, *, block_size: int = 16,
                  family: str = "gqa", prefetch=None, dtype: str = "float16",
                  lengths: str = "equal", num_sms: int | None = None,
                  gpu: str = REFERENCE, recordings: bool = True) -> Prediction:
    """The time of one decode-attention launch of one layer, at any point.

    model_or_shape: a kvlab.MODELS name, or (num_qo_heads, num_kv_heads, head_dim) with 1-8
        query heads a KV head and head_dim in kvlab.checks.HEAD_DIMS.
    batch, context: sequences, and tokens of each (None with mixed `lengths`).
    block_size, family ("vllm_v1", "gqa"), prefetch (None, a PrefetchConfig or its label),
    dtype of the KV cache ("float16", "bfloat16"; gqa also "fp8"), lengths ("equal",
    "lognormal:MEAN,MAX" or "production:MAX", drawn as the benchmark draws them), num_sms (a
    green context's SMs; None: the whole GPU), gpu (a key of kvlab.gpus.GPUS), recordings
    (False: the closed form at a recorded point too, e.g. for ratios of settings of which only
    some are recorded).
    Returns a Prediction: the recording where the point is recorded on the H200 (and
    `recordings`), else the closed form, labelled interpolated or extrapolated. For another
    GPU than the H200 the copy roofline, the per-SM and L2 rates are assumptions (kvlab.gpus),
    and so said in the note.
    Raises ValueError, naming the parameter, its value and what is allowed, before any work
    (kvlab.predict.point.launch_point), and where predict.json is not recorded.
    """
    check_bool("recordings", recordings)
    point = launch_point(model_or_shape, batch, context, block_size=block_size, family=family,
                         prefetch=prefetch, dtype=dtype, lengths=lengths, num_sms=num_sms,
                         gpu_key=gpu)
    recorded = measured(point) if recordings else None
    if recorded is not None and recorded.source in FITTED:
        return _measured(recorded, None)
    model = fitted()
    fit = model["fits"][point.family]
    label = modelled_prefetch(fit, point.prefetch)
    ms = 1e3 * float(time_s(stack([launch(point, model["by_sms"])]), fit, label)[0])
    if recorded is not None:  # a recording of earlier kernels
        return _measured(recorded, ms)
    return _modelled(point, ms, label, model)


def _modelled(point: LaunchPoint, ms: float, label: str, model: dict) -> Prediction:
    """The closed form's answer `ms` for `point`, its prefetch modelled as `label`."""
    outside = _outside(point, model["ranges"], point.prefetch.label())
    source = "extrapolated" if outside else "interpolated"
    bands = model["bands"][point.family]
    error = min(0.99, bands.get(label, bands[ALL])["extrapolated" if outside else "interpolated"])
    # the reference's copy roofline as predict.json holds it (attention.json's, at every SM)
    whole, how = ((model["by_sms"][point.gpu.num_sms], "") if point.gpu.key == REFERENCE else
                  spec_roofline_gbps(point.gpu))
    gbps = point.kv_bytes / ms / 1e6
    notes = [f"closed form fitted to the H200's recordings (predict.json), {source}"]
    if outside:
        notes.append("beyond the recorded " + ", ".join(f"{k} ({v})" for k, v in outside.items()))
    if label != point.prefetch.label():
        notes.append(f"prefetch {point.prefetch.label()!r} modelled as {label!r}")
    if point.gpu.key != REFERENCE:
        sm_roofline = sm_roofline_gbps(point.gpu, point.num_sms, model["by_sms"])
        notes.append(f"{point.gpu.name}: copy roofline {how}; on {point.num_sms} SMs "
                     f"{sm_roofline:,.0f} GB/s; per-SM rates scaled by the boost clock, the L2 "
                     "rate by L2 size x clock (assumptions)")
    return Prediction(ms, gbps, gbps / whole, source, "; ".join(notes),
                      (ms / (1 + error), ms / (1 - error)), tuple(outside))


def prefetch_speedup(model_or_shape, batch: int, context: int, prefetch, *,
                     family: str = "vllm_v1", gpu: str = REFERENCE, **point) -> float:
    """How much faster one launch runs with `prefetch` than without on `gpu`: the closed form's
    time without over its time with (decode_launch with recordings=False for both, so that a
    recording of one side does not stand against the model of the other). `point`: the other
    keywords of decode_launch. Raises ValueError as decode_launch does (a bulk prefetch on a GPU
    before sm_90, say)."""
    def ms(setting):
        return decode_launch(model_or_shape, batch, context, family=family, prefetch=setting,
                             gpu=gpu, recordings=False, **point).time_ms

    with_prefetch = ms(prefetch)  # checks `prefetch` first
    return ms(None) / with_prefetch

