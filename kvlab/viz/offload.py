"""Figures of KVPR: the predicted step time against the split point, the measured overlap of one
decode step (its stream spans, a Gantt chart per stream on a microsecond axis), and the step time
of every setting with the best KVPR split's speedup over each baseline.

Results of `python -m kvlab bench kvpr` recorded before the column-by-column schedule and the
offloaded weights have no `schedule`, `gpu_batches` or `weights`: `with_defaults` reads them as
what that runtime did (row-by-row, one GPU batch, weights resident). Rows with `cuda_graphs`
False ran each layer eagerly (`--no-cuda-graphs`): their group is labelled "eager".

NOTE: the Gantt chart is drawn with horizontal bars and `base=`, not `px.timeline`, which turns
its axis into dates with millisecond resolution: these operations last tens of microseconds.
"""

from __future__ import annotations

import itertools

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.checks import check_int, check_positive_int
from kvlab.offload.scheduler import (
    MODELS_OF_TIME,
    WEIGHTS,
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_times,
    layer_weight_bytes,
)
from kvlab.results import nearest_point
from kvlab.viz.layout import style

__all__ = [
    "BASELINES", "OP_COLORS", "ROW_DEFAULTS", "SPLIT_TITLE", "baseline_speedups",
    "describe_point", "gpu_bytes", "nearest_overlap", "overlap_figure", "point_rows",
    "recorded_rates", "recorded_times", "schedule_label", "speedup_figure", "split_figure",
    "split_points", "with_defaults",
]

# The runtime's streams (kvlab.offload's LANES), top to bottom; a lane not listed goes below.
LANE_ORDER = ("H2D", "compute", "D2H")
OP_COLORS = {"X": "#ff7f0e", "KV": "#1f77b4", "recompute": "#2ca02c", "layer": "#9467bd",
             "new token": "#7f7f7f", "W_KV": "#d62728", "W_rest": "#e377c2"}
MODEL_DASH = {"paper": "dot", "chunked": "dash", "pipelined": "solid"}
MODEL_COLORS = {"paper": "#636efa", "chunked": "#00cc96", "pipelined": "#ff7f0e"}
GROUP_COLORS = ("#2ca02c", "#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
# What a row recorded before these keys existed ran with.
ROW_DEFAULTS = {"schedule": "row", "gpu_batches": 1, "weights": "resident"}
SETTINGS = ("kvpr-paper", "kvpr-chunked", "kvpr-pipelined", "full-transfer", "full-recompute",
            "hf-offloaded")
BASELINES = ("full-transfer", "full-recompute", "hf-offloaded")
SPLIT_TITLE = "{model}: predicted step vs split l"  # `split_figure`'s, for str.format(model=...)


def with_defaults(row: dict) -> dict:
    """`row` (a benchmark row or an overlap) with `ROW_DEFAULTS` where a key is absent or None."""
    return {**row, **{k: d for k, d in ROW_DEFAULTS.items() if row.get(k) is None}}


def schedule_label(row: dict) -> str:
    """How a row ran: "row, weights resident", "column x4, weights offloaded" (4 GPU batches),
    with ", eager" where its layers ran without CUDA graphs."""
    r = with_defaults(row)
    schedule = r["schedule"] if r["gpu_batches"] == 1 else f"{r['schedule']} x{r['gpu_batches']}"
    return f"{schedule}, weights {r['weights']}" + (", eager" if r.get("cuda_graphs") is False
                                                    else "")


def describe_point(row: dict) -> str:
    """One line naming a row's or an overlap's point, schedule and setting, e.g. "opt-6.7b,
    batch 16 x 1024, row, weights resident, kvpr-pipelined at l=1024"."""
    split = "" if row.get("l") is None else f" at l={row['l']}"
    return (f"{row['model']}, batch {row['batch']} x {row['context']}, {schedule_label(row)}, "
            f"{row['setting']}{split}")


def _one_point(rows: list[dict]) -> tuple[str, int, int]:
    points = {(r["model"], r["batch"], r["context"]) for r in rows}
    if len(points) != 1:
        raise ValueError(f"rows cover {len(points)} (model, batch, context) points: must cover one")
    return points.pop()


# LinkAndCompute's times that a benchmark row records beside the rates: field -> row key (ms)
RECORDED_TIMES = {"layer_seconds": "layer_ms", "unit_host_seconds": "unit_host_ms",
                  "chunk_host_seconds": "chunk_host_ms"}


def recorded_times(row: dict) -> dict:
    """The layer's own time and the host's per unit and per chunk that `row` recorded, as
    LinkAndCompute keyword arguments in seconds (those not recorded are left out: zero)."""
    return {field: row[key] * 1e-3 for field, key in RECORDED_TIMES.items()
            if row.get(key) is not None}


def recorded_rates(row: dict, source: str) -> LinkAndCompute:
    """The rates measured with a KVPR row (`h2d_gbps`, `recompute_tflops`) and the layer's and
    the host's times recorded with them; `source` says where (e.g. `kvlab.results.label`)."""
    return LinkAndCompute(row["h2d_gbps"] * 1e9, row["recompute_tflops"] * 1e12, source,
                          **recorded_times(row))


def gpu_bytes(shape: LayerShape, weights: str) -> tuple[int, int]:
    """What KVPR's runtime (kvlab.offload.runtime.KVPRDecoder) keeps on the GPU for units of
    `shape`, at least: (the layers' weights: every layer's where `weights` is "resident", its two
    weight slots of one layer each where "offloaded"; its two buffer slots, each one unit's K, V
    and X of the whole context). ValueError for `weights` not in WEIGHTS."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: must be one of {WEIGHTS}")
    layer = layer_weight_bytes(shape.model, shape.dtype_bytes)[1]
    num_layers = shape.model.num_layers if weights == "resident" else 2
    buffers = 2 * (shape.kv_bytes(0) + shape.activation_bytes(shape.context))
    return num_layers * layer, int(buffers)


def point_rows(result: dict, model: str, batch: int, context: int) -> list[dict]:
    """The rows of `result` at `model`'s recorded point nearest to (`batch`, `context`)
    (`kvlab.results.nearest_point`): every setting, schedule and weights placement there; []
    when `model` has no rows."""
    if not any(r["model"] == model for r in result["rows"]):
        return []
    b, c = nearest_point(result, model, batch, context)
    return [r for r in result["rows"] if (r["model"], r["batch"], r["context"]) == (model, b, c)]


def split_points(rows: list[dict], schedule: str = "row", weights: str = "resident",
                 gpu_batches: int = 1) -> list[dict]:
    """The rows of KVPR's runtime (l recorded: not HF's cache) that ran with `schedule`,
    `gpu_batches` and `weights`: the points `split_figure` draws. Rows run without CUDA graphs
    (an ablation of the host's cost) only where no other row is there."""
    mine = [r for r in map(with_defaults, rows) if r.get("l") is not None
            and (r["schedule"], r["gpu_batches"], r["weights"]) == (schedule, gpu_batches, weights)]
    graphed = [r for r in mine if r.get("cuda_graphs") is not False]
    return graphed or mine


def nearest_overlap(overlaps: list[dict], model: str, batch: int, context: int,
                    schedule: str = "row", weights: str = "resident",
                    setting: str = "kvpr-pipelined", gpu_batches: int = 1) -> dict | None:
    """The overlap (a recorded step's stream spans and point: an entry of a KVPR result's
    "timelines") of `model` and `schedule` at the recorded point nearest to (`batch`,
    `context`) (as `kvlab.results.nearest_point`), of `weights`, `gpu_batches` and `setting`
    where there is one (in that order of preference). None when no overlap of `model` with
    `schedule` is recorded."""
    mine = [t for t in map(with_defaults, overlaps)
            if t["model"] == model and t["schedule"] == schedule]
    if not mine:
        return None
    point = nearest_point({"rows": mine}, model, batch, context)
    here = [t for t in mine if (t["batch"], t["context"]) == point]
    return min(here, key=lambda t: (t["weights"] != weights, t["gpu_batches"] != gpu_batches,
                                    t["setting"] != setting))


def _kind(name: str) -> str:
    """The operation kind of a span name: "X[0:230]" -> "X", "recompute [0:230]" -> "recompute"."""
    return name.split("[")[0].strip()


def overlap_figure(spans: list[dict], provenance: str, height: int = 320,
                   point: str = "") -> go.Figure:
    """One bar per operation of a decode step (`StreamSpans.spans()` of the KVPR runtime), one row
    per stream, on a microsecond axis, coloured by kind; hover gives name, layer, times and, where
    spans carry `batch`, the GPU batch (column-by-column schedule). `point` (e.g. from
    `describe_point`) starts the title."""
    if not spans:
        raise ValueError("spans is empty: record a step with KVPRDecoder(..., record_spans=True)")
    fig = go.Figure()
    present = list(dict.fromkeys(s["lane"] for s in spans))
    lanes = [lane for lane in LANE_ORDER if lane in present]
    lanes += [lane for lane in present if lane not in LANE_ORDER]
    for kind in dict.fromkeys(_kind(s["name"]) for s in spans):
        mine = [s for s in spans if _kind(s["name"]) == kind]
        batched = any("batch" in s for s in mine)
        fig.add_trace(go.Bar(
            name=kind, orientation="h", y=[s["lane"] for s in mine],
            base=[s["start_us"] for s in mine], x=[s["end_us"] - s["start_us"] for s in mine],
            marker_color=OP_COLORS.get(kind, "#bcbd22"),
            customdata=[[s["name"], s["layer"], s["start_us"], s["end_us"], s.get("batch", 0)]
                        for s in mine],
            hovertemplate="%{customdata[0]}, layer %{customdata[1]}"
                          + (", GPU batch %{customdata[4]}" if batched else "")
                          + "<br>%{customdata[2]:.1f} - %{customdata[3]:.1f} us<extra></extra>",
        ))
    end_ms = max(s["end_us"] for s in spans) / 1e3
    fig.update_layout(
        barmode="overlay",
        xaxis_title="time from the step's start (us)",
        yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]),
        legend_title="operation",
    )
    return style(fig, f"One decode step: {end_ms:.2f} ms", provenance, point, height=height)


def split_figure(shape: LayerShape, rates: LinkAndCompute, selected_l: int | None = None,
                 num_chunks: int = 8, height: int = 380, measured: list[dict] | None = None,
                 provenance: str = "", gpu_batches: int = 1, note: str = "") -> go.Figure:
    """Predicted decode-step time against the split l under each model of time, each model's
    optimum marked, and `selected_l` as a vertical line. `shape` is one unit's work
    (`kvlab.offload.scheduler.unit_shape`); a step is num_layers x `gpu_batches` units.
    `measured`: benchmark rows (`l`, `step_ms`, `setting`) of this shape, drawn as points named
    by their schedule, with `provenance` on a subtitle line; rows without a split (HF's offloaded
    cache) are left out. `note`: a subtitle line (e.g. a context past the model's maximum).
    Raises ValueError for a `selected_l` not None nor an integer in [0, shape.context], or a
    `gpu_batches` that is not a positive integer."""
    if selected_l is not None:
        check_int("selected_l", selected_l, 0, shape.context)
    check_positive_int("gpu_batches", gpu_batches)
    units = shape.model.num_layers * gpu_batches
    ls = np.arange(shape.context + 1)
    fig = go.Figure()
    for model_of_time in MODELS_OF_TIME:
        ms = 1e3 * units * layer_times(shape, rates, model_of_time, num_chunks)
        best = best_split(shape, rates, model_of_time, num_chunks)
        color = MODEL_COLORS[model_of_time]
        fig.add_trace(go.Scatter(x=ls, y=ms, mode="lines", name=f"{model_of_time} model",
                                 legendgroup=model_of_time,
                                 line=dict(dash=MODEL_DASH[model_of_time], color=color)))
        fig.add_trace(go.Scatter(
            x=[best.l], y=[1e3 * units * best.seconds], mode="markers",
            name=f"{model_of_time} optimum", legendgroup=model_of_time,
            marker=dict(size=10, symbol="diamond", color=color),
            hovertemplate=f"{model_of_time} optimum: l=%{{x}}, %{{y:.2f}} ms, "
                          f"{best.speedup:.2f}x full transfer<extra></extra>",
        ))
    measured = [r for r in measured or [] if r.get("l") is not None]
    if measured:
        fig.add_trace(go.Scatter(
            x=[r["l"] for r in measured], y=[r["step_ms"] for r in measured], mode="markers",
            name=f"measured ({schedule_label(measured[0])})",
            marker=dict(size=9, color="black", symbol="x"),
            text=[r["setting"] for r in measured],
            hovertemplate="%{text}: l=%{x}, %{y:.2f} ms<extra></extra>",
        ))
    if selected_l is not None:
        fig.add_vline(x=selected_l, line=dict(color="black", width=1))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"chosen l={selected_l}",
                                 line=dict(color="black", width=1)))  # its legend entry
    batch = f"batch {shape.batch * gpu_batches}" + (
        f" in {gpu_batches} GPU batches" if gpu_batches > 1 else "")
    weights = ", weights offloaded" if any(shape.weight_bytes) else ""
    fig.update_layout(xaxis_title="l: tokens whose K, V are recomputed",
                      yaxis=dict(title="decode step (ms)", rangemode="tozero"))
    return style(
        fig, SPLIT_TITLE.format(model=shape.model.name), (
            f"modelled with {rates.h2d_bytes_per_s / 1e9:.1f} GB/s and "
            f"{rates.recompute_flops_per_s / 1e12:.0f} TFLOP/s<br>({rates.source})"),
        f"{batch} x {shape.context} tokens{weights}", note,
        f"x = measured, {provenance}" if measured else "", height=height)


def baseline_speedups(rows: list[dict]) -> list[dict]:
    """The fastest KVPR setting (kvpr-*) of each schedule / weights group of `rows` (one point)
    against each baseline: full transfer and full recompute of the same group, and HF's offloaded
    cache with the same weights placement (it has its own schedule).

    Returns [{group, setting, l, step_ms, baseline, baseline_ms, speedup}], groups in recorded
    order, baselines in `BASELINES` order; a group without a KVPR row or a baseline not recorded
    gives no entry. speedup = baseline_ms / step_ms."""
    _one_point(rows)
    rows = [with_defaults(r) for r in rows]
    pairs = []
    for group in dict.fromkeys(schedule_label(r) for r in rows):
        mine = [r for r in rows if schedule_label(r) == group]
        kvpr = [r for r in mine if r["setting"].startswith("kvpr-")]
        if not kvpr:
            continue
        best = min(kvpr, key=lambda r: r["step_ms"])
        for baseline in BASELINES:
            pool = rows if baseline == "hf-offloaded" else mine
            base = [r for r in pool if r["setting"] == baseline and r["weights"] == best["weights"]]
            if base:
                pairs.append({"group": group, "setting": best["setting"], "l": best["l"],
                              "step_ms": best["step_ms"], "baseline": baseline,
                              "baseline_ms": base[0]["step_ms"],
                              "speedup": base[0]["step_ms"] / best["step_ms"]})
    return pairs


def speedup_figure(rows: list[dict], provenance: str, height: int = 380) -> go.Figure:
    """Rows of `python -m kvlab bench kvpr` at one (model, batch, context): left, the decode-step
    time of each setting, one bar colour per schedule / weights group; right, the speedup of each
    group's fastest KVPR setting over each baseline (`baseline_speedups`), as text on the bars.

    Raises ValueError when `rows` cover more or less than one point."""
    model, batch, context = _one_point(rows)
    rows = [with_defaults(r) for r in rows]
    groups = list(dict.fromkeys(schedule_label(r) for r in rows))
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in rows)]
    settings += list(dict.fromkeys(r["setting"] for r in rows if r["setting"] not in settings))
    pairs = baseline_speedups(rows)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=("step per setting (ms)", "fastest KVPR: speedup"))
    fig.update_annotations(font_size=13)  # the subplot titles
    for group, color in zip(groups, itertools.cycle(GROUP_COLORS)):
        mine = [r for r in rows if schedule_label(r) == group]
        bars = {"name": group, "legendgroup": group, "marker_color": color,
                "textposition": "outside", "hoverinfo": "text", "cliponaxis": False,
                "constraintext": "none", "textfont_size": 10, "textangle": -90}
        fig.add_trace(go.Bar(
            **bars, x=[r["setting"] for r in mine], y=[r["step_ms"] for r in mine],
            text=[f"{r['step_ms']:.0f}" for r in mine],
            hovertext=[f"{describe_point(r)}: {r['step_ms']:.2f} ms, "
                       f"{r['tokens_per_s']:.0f} tokens/s" for r in mine],
        ), row=1, col=1)
        mine = [p for p in pairs if p["group"] == group]
        fig.add_trace(go.Bar(
            **bars, showlegend=False, x=[p["baseline"] for p in mine],
            y=[p["speedup"] for p in mine], text=[f"{p['speedup']:.2f}x" for p in mine],
            hovertext=[f"{group}: {p['setting']} (l={p['l']}) {p['step_ms']:.2f} ms, "
                       f"{p['baseline']} {p['baseline_ms']:.2f} ms" for p in mine],
        ), row=1, col=2)
    fig.add_hline(y=1, line=dict(color="gray", width=1, dash="dot"), row=1, col=2)
    fig.update_xaxes(categoryorder="array", categoryarray=settings, row=1, col=1)
    fig.update_xaxes(categoryorder="array", categoryarray=list(BASELINES), row=1, col=2)
    # headroom above the tallest bar for its vertical label, below the subplot title
    top = [max((r["step_ms"] for r in rows), default=1), max(
        (p["speedup"] for p in pairs), default=1)]
    fig.update_yaxes(title_text="decode step (ms)", range=[0, 1.3 * top[0]], row=1, col=1)
    fig.update_yaxes(title_text="speedup (x)", range=[0, 1.3 * max(top[1], 1)], row=1, col=2)
    against = ", ".join(dict.fromkeys(p["baseline"] for p in pairs)) or "no baseline recorded"
    fig.update_layout(barmode="group", legend_title="schedule")
    # the first of these angles that keeps the setting names apart at the chart's width
    fig.update_xaxes(automargin=True, autotickangles=[45, 90])
    return style(fig, f"{model}, batch {batch} x {context}", provenance,
                 f"fastest KVPR setting vs {against}", height=height)
