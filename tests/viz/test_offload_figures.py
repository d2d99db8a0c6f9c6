"""KVPR figures: the Gantt bars are the spans (microsecond axis, not dates), the split curves are
the scheduler's, and the Chrome trace has one track per stream."""

import json

import pytest

from kvlab.config import MODELS
from kvlab.offload.runtime import chrome_trace
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split
from kvlab.viz.offload import split_figure, timeline_figure

SPANS = [
    {"lane": "H2D", "name": "X[0:4]", "layer": 0, "start_us": 1.0, "end_us": 11.5},
    {"lane": "H2D", "name": "KV[4:9]", "layer": 0, "start_us": 11.5, "end_us": 30.0},
    {"lane": "compute", "name": "recompute [0:4]", "layer": 0, "start_us": 12.0, "end_us": 20.0},
    {"lane": "compute", "name": "layer", "layer": 0, "start_us": 30.5, "end_us": 42.25},
    {"lane": "D2H", "name": "new token", "layer": 0, "start_us": 43.0, "end_us": 44.0},
]
HW = LinkAndCompute(55.4e9, 670e12, "recorded on NVIDIA H200, 2026-11-29")


def test_timeline_bars_are_the_spans_on_a_microsecond_axis():
    fig = timeline_figure(SPANS, "measured on TEST GPU")
    assert [t.name for t in fig.data] == ["X", "KV", "recompute", "layer", "new token"]
    bars = {t.name: t for t in fig.data}
    assert list(bars["layer"].base) == [30.5] and list(bars["layer"].x) == [11.75]
    assert list(bars["X"].y) == ["H2D"] and all(t.orientation == "h" for t in fig.data)
    assert fig.layout.xaxis.type in (None, "linear")  # px.timeline would make it "date"
    assert list(fig.layout.yaxis.categoryarray) == ["D2H", "compute", "H2D"]
    assert "0.04 ms" in fig.layout.title.text and "measured on TEST GPU" in fig.layout.title.text


def test_timeline_without_spans_is_refused():
    with pytest.raises(ValueError, match="spans is empty"):
        timeline_figure([], "x")


def test_split_figure_draws_each_model_and_its_optimum():
    shape = LayerShape(MODELS["opt-6.7b"], batch=16, context=1024)
    fig = split_figure(shape, HW, selected_l=300)
    curves = [t for t in fig.data if t.mode == "lines"]
    optima = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in curves] == ["paper model", "chunked model", "pipelined model"]
    for model, marker in zip(("paper", "chunked", "pipelined"), optima, strict=True):
        best = best_split(shape, HW, model)
        assert list(marker.x) == [best.l]
        assert marker.y[0] == pytest.approx(1e3 * 32 * best.seconds)
    assert len(curves[0].x) == 1025 and [s.x0 for s in fig.layout.shapes] == [300]
    assert "recorded on NVIDIA H200" in fig.layout.title.text


def test_chrome_trace_has_a_track_per_stream():
    trace = chrome_trace(SPANS)
    json.dumps(trace)
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "thread_name"}
    assert names == {0: "H2D", 1: "compute", 2: "D2H"}
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(SPANS)
    layer = next(e for e in events if e["name"] == "layer")
    assert (layer["tid"], layer["ts"], layer["dur"]) == (1, 30.5, 11.75)
