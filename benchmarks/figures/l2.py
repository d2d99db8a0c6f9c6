"""The L2 model against ncu and the measured times (results/cpu/l2_validation.json).
"""

from __future__ import annotations

from kvlab.results import load_result

from .common import value_range


def l2_validation_table(result: dict) -> list[str]:
    """The L2 model against ncu and the measured times (results/cpu/l2_validation.json): per
    kernel family, SM count and prefetch setting, the mean absolute error of the modelled hit
    rate of the loads (the target's; where the counters hold the loads' own hits) and of ncu's
    headline rate (every lookup), and the median relative error of the modelled time; then all
    together."""
    s = result["summary"]
    loads = s["hit_mae_points"]["near_hit_rate"] is not None
    lines = ["| kernel, SMs, prefetch | launches | "
             + ("loads' hit rate: mean abs. error | " if loads else "")
             + "ncu's hit rate (every lookup): mean abs. error | time: median error |",
             "|---|---|---|---|" + ("---|" if loads else "")]
    counts = {}
    for r in result["rows"]:
        block = "" if r["block_size"] == 16 else f", block {r['block_size']}"
        key = f"{r['kernel']}, {r['sms']} SMs, {r['prefetch']}{block}"
        counts[key] = counts.get(key, 0) + 1
    for key, g in result["summary"]["by_group"].items():
        if g["time_median_rel"] is None:
            time = "not timed"
        else:
            fitted = " (fitted)" if key.endswith(", 132 SMs, none") else ""
            time = f"{100 * g['time_median_rel']:.1f}%{fitted}"
        own = f"{g['hit_mae_points']:.1f} points | " if loads else ""
        lines.append(f"| {key} | {counts[key]} | {own}"
                     f"{g['headline_hit_mae_points']:.1f} points | {time} |")
    own = f"{s['hit_mae_points']['near_hit_rate']:.1f} points | " if loads else ""
    lines.append(f"| all | {s['configs']} | {own}"
                 f"{s['hit_mae_points']['ncu_hit_rate']:.1f} points | "
                 f"{100 * s['time_median_rel']:.1f}% ({s['time_checked']} not fitted; "
                 f"{100 * s['time_within_25pct']:.0f}% within 25%) |")
    return lines


BLOCKS = {
    "l2.validation": lambda: l2_validation_table(load_result("cpu", "l2_validation")),
}


# ---- Figures inside the sentences of docs/l2-model.md ----------------------------------------

def _validation() -> dict:
    return load_result("cpu", "l2_validation")


def _rows(kernel=None, prefetch=None, block_size=16, models=None) -> list[dict]:
    """l2_validation.json's launches of `kernel` with `prefetch` (a label, a tuple of labels,
    or None for all) at `block_size`, of `models` (None: all)."""
    labels = (prefetch,) if isinstance(prefetch, str) else prefetch
    return [r for r in _validation()["rows"]
            if (kernel is None or r["kernel"] == kernel)
            and (labels is None or r["prefetch"] in labels) and r["block_size"] == block_size
            and (models is None or r["model"] in models)]


def _range(values, fmt="{:.1f}", unit="%") -> str:
    return value_range(values, fmt, unit)


def _span(column: str, **keep) -> str:
    return _range([r[column] for r in _rows(**keep)])


def _gaps(measured: str, modelled: str, sign: int = 1, **keep) -> str:
    """The range of (measured - modelled) x sign, in points: sign -1 for how far below the
    model the measured rates lie."""
    return _range([sign * (r[measured] - r[modelled]) for r in _rows(**keep)], "{:.1f}",
                  " points")


def _targets() -> str:
    t = _validation()["targets"]
    return (f"a mean hit-rate error of at most {t['hit_mae_points']:.0f} points and a median "
            f"time error of at most {100 * t['time_median_rel']:.0f}%, with "
            f"{100 * t['time_within_25pct']:.0f}% of the launches within 25%")


def _verdict() -> str:
    s, t = _validation()["summary"], _validation()["targets"]
    met = (s["hit_mae_points"]["near_hit_rate"] <= t["hit_mae_points"]
           and s["time_median_rel"] <= t["time_median_rel"]
           and s["time_within_25pct"] >= t["time_within_25pct"])
    return "Both are met" if met else "They are not all met"


def _durations(kernel: str, prefetch: str) -> str:
    """ncu's duration without over with `prefetch` in counters_prefetch.json (one launch each)."""
    rows = load_result("h200", "counters_prefetch")["rows"]
    key = ("kernel", "model", "batch", "context")
    none = {tuple(r[k] for k in key): r for r in rows if r["prefetch"] == "none"}
    return _range([none[tuple(r[k] for k in key)]["duration_us"] / r["duration_us"]
                   for r in rows if (r["kernel"], r["prefetch"]) == (kernel, prefetch)],
                  "{:.2f}", "x")


def _group_range(column: str, groups) -> str:
    by = _validation()["summary"]["by_group"]
    return _range([by[g][column] for g in groups], "{:.1f}", " points")


def _time_model() -> str:
    t = _validation()["time_model"]
    return (f"{t['l2_gbps_per_sm']:.0f} GB/s per SM; efficiency {t['vllm_v1']['efficiency']:.2f} "
            f"for `vllm_v1`, {t['gqa']['efficiency']:.2f} for `gqa`; launch cost "
            f"{t['vllm_v1']['launch_us']:.0f} us and {t['gqa']['launch_us']:.0f} us")


def _fitted_count() -> str:
    return f"{sum(r['fitted'] and r['ms'] is not None for r in _validation()['rows'])}"


def _time_error(kernel, prefetch, sms) -> str:
    g = _validation()["summary"]["by_group"][f"{kernel}, {sms} SMs, {prefetch}"]
    return f"{100 * g['time_median_rel']:.1f}%"


def _l2sim(which: str) -> str:
    r = load_result("cpu", "l2sim")
    runs = [v / 1e6 for v in r[f"{which}_runs"]]
    return f"{r[f'{which}_sectors_per_s'] / 1e6:.1f} M/s ({min(runs):.1f}-{max(runs):.1f})"


def _shares() -> str:
    from kvlab.sim import l2

    return (f"`FABRIC_LOOKUP_SHARE = {l2.FABRIC_LOOKUP_SHARE}`, "
            f"`NEAR_HOME_SHARE = {l2.NEAR_HOME_SHARE}`")


def _provenance(machine: str, name: str) -> str:
    from .common import source

    return source(machine, name)


_GQA_MODELS = ("llama3-8b", "qwen2.5-7b", "qwen2.5-14b")
_D1 = ("bulk K+V d=1", "line K+V d=1")
_S = lambda: _validation()["summary"]  # noqa: E731

BLOCKS.update({
    "l2.source-validation": lambda: _provenance("cpu", "l2_validation"),
    "l2.source-prefetch": lambda: _provenance("h200", "counters_prefetch"),
    "l2.source-block32": lambda: _provenance("h200", "counters_block32"),
    "l2.source-l2sim": lambda: _provenance("cpu", "l2sim"),
    "l2.launches": lambda: f"{_S()['configs']}",
    "l2.targets": _targets,
    "l2.verdict": _verdict,
    "l2.near-mae": lambda: f"{_S()['hit_mae_points']['near_hit_rate']:.1f} points",
    "l2.ncu-mae": lambda: f"{_S()['hit_mae_points']['ncu_hit_rate']:.1f} points",
    "l2.one-cache-mae": lambda: f"{_S()['hit_mae_points']['hit_rate']:.1f} points",
    "l2.time-median": lambda: f"{100 * _S()['time_median_rel']:.1f}%",
    "l2.time-within": lambda: f"{100 * _S()['time_within_25pct']:.0f}% within 25%",
    "l2.time-checked": lambda: f"{_S()['time_checked']}",
    "l2.fitted": _fitted_count,
    "l2.shares": _shares,
    "l2.gqa-ncu-d1": lambda: _span("ncu_hit_pct", kernel="gqa", prefetch=_D1),
    "l2.mha-ncu-d1": lambda: _span("ncu_hit_pct", kernel="vllm_v1", prefetch=_D1,
                                   models=("llama2-7b",)),
    "l2.gqa-model-ncu-d1": lambda: _span("model_ncu_hit_rate_pct", kernel="gqa", prefetch=_D1),
    "l2.gqa-loads-d1": lambda: _span("ncu_load_hit_pct", kernel="gqa", prefetch=_D1),
    "l2.gqa-model-loads-d1": lambda: _span("model_near_hit_rate_pct", kernel="gqa",
                                           prefetch=_D1),
    "l2.gqa-none-mae": lambda: _group_range("hit_mae_points", [
        f"gqa, {s} SMs, none" for s in (132, 80, 32)]),
    "l2.gqa-none-ncu": lambda: _span("ncu_hit_pct", kernel="gqa", prefetch="none"),
    "l2.gqa-d2-ncu": lambda: _span("ncu_hit_pct", kernel="gqa", prefetch="bulk K+V d=2"),
    "l2.gqa-d4-ncu": lambda: _span("ncu_hit_pct", kernel="gqa", prefetch="bulk K+V d=4"),
    "l2.gqa-d2-model": lambda: _span("model_ncu_hit_rate_pct", kernel="gqa",
                                     prefetch="bulk K+V d=2"),
    "l2.gqa-d4-model": lambda: _span("model_ncu_hit_rate_pct", kernel="gqa",
                                     prefetch="bulk K+V d=4"),
    "l2.gqa-d2-time": lambda: _durations("gqa", "bulk K+V d=2"),
    "l2.gqa-d4-time": lambda: _durations("gqa", "bulk K+V d=4"),
    "l2.gqa-line-time": lambda: _durations("gqa", "line K+V d=1"),
    "l2.v1-d4-ncu": lambda: _span("ncu_hit_pct", kernel="vllm_v1", prefetch="bulk K+V d=4"),
    "l2.v1-d4-model": lambda: _span("model_ncu_hit_rate_pct", kernel="vllm_v1",
                                    prefetch="bulk K+V d=4"),
    "l2.v1-d4-time": lambda: _durations("vllm_v1", "bulk K+V d=4"),
    "l2.gqa-loads-b32": lambda: _span("ncu_load_hit_pct", kernel="gqa", prefetch="bulk K+V d=1",
                                      block_size=32),
    "l2.gqa-loads-b16": lambda: _span("ncu_load_hit_pct", kernel="gqa", prefetch="bulk K+V d=1"),
    "l2.gqa-model-b32": lambda: _span("model_near_hit_rate_pct", kernel="gqa",
                                      prefetch="bulk K+V d=1", block_size=32),
    "l2.v1-gqa-none-gap": lambda: _gaps("ncu_load_hit_pct", "model_near_hit_rate_pct",
                                        kernel="vllm_v1", prefetch="none", models=_GQA_MODELS),
    "l2.v1-gqa-none-gap-b32": lambda: _gaps("ncu_load_hit_pct", "model_near_hit_rate_pct",
                                            kernel="vllm_v1", prefetch="none",
                                            models=_GQA_MODELS, block_size=32),
    "l2.v1-gqa-bulk-gap": lambda: _gaps("ncu_load_hit_pct", "model_near_hit_rate_pct", -1,
                                        kernel="vllm_v1", prefetch="bulk K+V d=1",
                                        models=_GQA_MODELS),
    "l2.v1-gqa-bulk-gap-ncu": lambda: _gaps("ncu_hit_pct", "model_ncu_hit_rate_pct", -1,
                                            kernel="vllm_v1", prefetch="bulk K+V d=1",
                                            models=_GQA_MODELS),
    "l2.time-model": _time_model,
    "l2.time-v1-bulk-32": lambda: _time_error("vllm_v1", "bulk K+V d=1", 32),
    "l2.time-gqa-bulk": lambda: _range([100 * _S()["by_group"][f"gqa, {s} SMs, bulk K+V d=1"][
        "time_median_rel"] for s in (132, 80)], "{:.1f}", "%"),
    "l2.time-gqa-none-32": lambda: _time_error("gqa", "none", 32),
    "l2.sim-cache": lambda: _l2sim("cache"),
    "l2.sim-simulate": lambda: _l2sim("simulate"),
    "l2.sim-target": lambda: f"{load_result('cpu', 'l2sim')['target_sectors_per_s'] / 1e6:.0f} M/s",
})
