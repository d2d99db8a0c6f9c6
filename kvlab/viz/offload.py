"""Figures of KVPR: the predicted step time against the split point, and the measured timeline of
one decode step (a Gantt chart per stream on a microsecond axis).

NOTE: the Gantt chart is drawn with horizontal bars and `base=`, not `px.timeline`, which turns
its axis into dates with millisecond resolution: these operations last tens of microseconds.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from kvlab.offload.runtime import LANES
from kvlab.offload.scheduler import (
    MODELS_OF_TIME,
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_times,
)

__all__ = ["OP_COLORS", "settings_figure", "split_figure", "timeline_figure"]

OP_COLORS = {"X": "#ff7f0e", "KV": "#1f77b4", "recompute": "#2ca02c", "layer": "#9467bd",
             "new token": "#7f7f7f"}
MODEL_DASH = {"paper": "dot", "chunked": "dash", "pipelined": "solid"}


def _kind(name: str) -> str:
    """The operation kind of a span name: "X[0:230]" -> "X", "recompute [0:230]" -> "recompute"."""
    return name.split("[")[0].strip()


def timeline_figure(spans: list[dict], provenance: str, height: int = 320) -> go.Figure:
    """One bar per operation of a decode step (`Timeline.spans()` of the KVPR runtime), one row
    per stream, on a microsecond axis, coloured by kind; hover gives name, layer and times."""
    if not spans:
        raise ValueError("spans is empty: record a step with KVPRDecoder(..., timeline=True)")
    fig = go.Figure()
    lanes = [lane for lane in LANES if any(s["lane"] == lane for s in spans)]
    for kind in dict.fromkeys(_kind(s["name"]) for s in spans):
        mine = [s for s in spans if _kind(s["name"]) == kind]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", y=[s["lane"] for s in mine],
            base=[s["start_us"] for s in mine], x=[s["end_us"] - s["start_us"] for s in mine],
            marker_color=OP_COLORS.get(kind, "#bcbd22"),
            customdata=[[s["name"], s["layer"], s["start_us"], s["end_us"]] for s in mine],
            hovertemplate="%{customdata[0]}, layer %{customdata[1]}<br>"
                          "%{customdata[2]:.1f} - %{customdata[3]:.1f} us<extra></extra>",
        ))
    end_ms = max(s["end_us"] for s in spans) / 1e3
    fig.update_layout(
        barmode="overlay", height=height,
        title=f"One decode step: {end_ms:.2f} ms ({provenance})",
        xaxis_title="time from the step's start (us)",
        yaxis=dict(categoryorder="array", categoryarray=lanes[::-1]),
        legend_title="operation",
    )
    return fig


def split_figure(shape: LayerShape, hw: LinkAndCompute, selected_l: int | None = None,
                 num_chunks: int = 8, height: int = 380, measured: list[dict] | None = None,
                 provenance: str = "") -> go.Figure:
    """Predicted decode-step time (all layers) against the split l under each model of time,
    each model's optimum marked, and `selected_l` as a vertical line. `measured`: benchmark rows
    (`l`, `step_ms`, `setting`) of this shape, drawn as points labelled with `provenance`."""
    layers = shape.model.num_layers
    ls = np.arange(shape.context + 1)
    fig = go.Figure()
    for model in MODELS_OF_TIME:
        ms = 1e3 * layers * layer_times(shape, hw, model, num_chunks)
        best = best_split(shape, hw, model, num_chunks)
        fig.add_trace(go.Scatter(x=ls, y=ms, mode="lines", name=f"{model} model",
                                 line=dict(dash=MODEL_DASH[model])))
        fig.add_trace(go.Scatter(
            x=[best.l], y=[1e3 * layers * best.seconds], mode="markers", showlegend=False,
            marker=dict(size=10, symbol="diamond"),
            hovertemplate=f"{model} optimum: l=%{{x}}, %{{y:.2f}} ms, {best.speedup:.2f}x full "
                          "transfer<extra></extra>",
        ))
    if measured:
        fig.add_trace(go.Scatter(
            x=[r["l"] for r in measured], y=[r["step_ms"] for r in measured], mode="markers",
            name=f"measured ({provenance})", marker=dict(size=9, color="black", symbol="x"),
            text=[r["setting"] for r in measured],
            hovertemplate="%{text}: l=%{x}, %{y:.2f} ms<extra></extra>",
        ))
    if selected_l is not None:
        fig.add_vline(x=selected_l, line=dict(color="black", width=1))
    m = shape.model
    fig.update_layout(
        height=height, xaxis_title="l: tokens whose K, V are recomputed",
        yaxis_title="predicted decode step (ms)",
        title=(f"{m.name}, batch {shape.batch} x {shape.context} tokens: modelled with "
               f"{hw.h2d_bytes_per_s / 1e9:.1f} GB/s and {hw.recompute_flops_per_s / 1e12:.0f} "
               f"TFLOP/s ({hw.source})"),
    )
    return fig


def settings_figure(rows: list[dict], provenance: str, height: int = 320) -> go.Figure:
    """Decode-step time of each setting at one (model, batch, context) of `python -m kvlab bench
    kvpr`, each bar labelled with its speedup over full transfer."""
    points = {(r["model"], r["batch"], r["context"]) for r in rows}
    if len(points) != 1:
        raise ValueError(f"rows cover {len(points)} (model, batch, context) points: must cover one")
    model, batch, context = points.pop()
    full = [r["step_ms"] for r in rows if r["setting"] == "full-transfer"]
    fig = go.Figure(go.Bar(
        x=[r["setting"] for r in rows], y=[r["step_ms"] for r in rows],
        text=[f"{full[0] / r['step_ms']:.2f}x" if full else "" for r in rows],
        customdata=[[r["l"], r["tokens_per_s"]] for r in rows],
        hovertemplate="%{x}: %{y:.2f} ms, l=%{customdata[0]}, %{customdata[1]:.0f} tokens/s"
                      "<extra></extra>",
        marker_color=["#7f7f7f" if r["setting"].startswith("full") else "#2ca02c" for r in rows],
    ))
    fig.update_layout(height=height, yaxis_title="decode step (ms)",
                      title=f"{model}, batch {batch} x {context}: speedup over full transfer "
                            f"({provenance})")
    return fig
