"""KVPR figures: the Gantt bars are the spans (microsecond axis, not dates), the split curves are
the scheduler's, the Chrome trace has one track per stream, and the speedup figure compares the
fastest KVPR split of each schedule / weights group with each baseline, in the recorded result
(rows without schedule, gpu_batches, weights; no overlaps) and in the format that has them."""

import json

import pytest

from kvlab.config import MODELS
from kvlab.offload.overlap import LANES, chrome_trace
from kvlab.offload.scheduler import (
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_time,
    layer_weight_bytes,
    unit_shape,
)
from kvlab.results import KVPR, label, load_result, load_results
from kvlab.viz.offload import (
    LANE_ORDER,
    OP_COLORS,
    baseline_speedups,
    describe_point,
    gpu_bytes,
    nearest_overlap,
    overlap_figure,
    schedule_label,
    speedup_figure,
    split_figure,
    split_points,
    with_defaults,
)

SPANS = [
    {"lane": "H2D", "name": "X[0:4]", "layer": 0, "start_us": 1.0, "end_us": 11.5},
    {"lane": "H2D", "name": "KV[4:9]", "layer": 0, "start_us": 11.5, "end_us": 30.0},
    {"lane": "compute", "name": "recompute [0:4]", "layer": 0, "start_us": 12.0, "end_us": 20.0},
    {"lane": "compute", "name": "layer", "layer": 0, "start_us": 30.5, "end_us": 42.25},
    {"lane": "D2H", "name": "new token", "layer": 0, "start_us": 43.0, "end_us": 44.0},
]
RATES = LinkAndCompute(55.4e9, 670e12, "recorded on NVIDIA H200, 2026-11-29")
PROVENANCE = "recorded on TEST GPU, 2026-12-01"


def make_row(setting, step_ms, split=512, schedule="row", gpu_batches=1, weights="resident",
             model="opt-6.7b", batch=16, context=1024):
    """A row of `python -m kvlab bench kvpr` in the format with schedule, gpu_batches, weights."""
    row = {"model": model, "batch": batch, "context": context, "h2d_gbps": 55.0,
           "recompute_tflops": 700.0, "setting": setting, "l": split, "step_ms": step_ms,
           "step_ms_runs": [step_ms], "tokens_per_s": batch / (step_ms * 1e-3),
           "predicted_paper_ms": step_ms, "predicted_chunked_ms": step_ms,
           "predicted_pipelined_ms": step_ms, "lower_bound_ms": step_ms,
           "ratio_to_lower_bound": 1.0, "link_busy_ms": step_ms, "compute_busy_ms": step_ms / 2,
           "overlap": 0.9, "schedule": schedule, "gpu_batches": gpu_batches, "weights": weights}
    if setting == "hf-offloaded":
        row.update({k: None for k in ("l", "predicted_paper_ms", "predicted_chunked_ms",
                                      "predicted_pipelined_ms", "overlap", "link_busy_ms",
                                      "compute_busy_ms")})
    return row


def make_point_rows(model="opt-6.7b", batch=16, context=1024):
    """Three groups at one point: row/resident with HF's cache, column x4 resident and offloaded."""
    point = dict(model=model, batch=batch, context=context)
    col = dict(schedule="column", gpu_batches=4)
    return [
        make_row("kvpr-paper", 100.0, 700, **point),
        make_row("kvpr-chunked", 90.0, 900, **point),
        make_row("kvpr-pipelined", 80.0, 1024, **point),
        make_row("full-transfer", 160.0, 0, **point),
        make_row("full-recompute", 84.0, 1024, **point),
        make_row("hf-offloaded", 240.0, **point),
        make_row("kvpr-pipelined", 50.0, 1024, **col, **point),
        make_row("full-transfer", 120.0, 0, **col, **point),
        make_row("kvpr-pipelined", 60.0, 800, **col, weights="offloaded", **point),
        make_row("full-transfer", 150.0, 0, **col, weights="offloaded", **point),
    ]


def make_column_spans():
    """Two GPU batches of one layer, weights offloaded: W_KV, W_rest on the link, then each
    batch's K, V and its layer."""
    return [
        {"lane": "H2D", "name": "W_KV", "layer": 0, "start_us": 0.0, "end_us": 5.0},
        {"lane": "H2D", "name": "W_rest", "layer": 0, "start_us": 5.0, "end_us": 25.0},
        {"lane": "H2D", "name": "KV[0:8]", "layer": 0, "batch": 0, "start_us": 25.0,
         "end_us": 30.0},
        {"lane": "H2D", "name": "KV[0:8]", "layer": 0, "batch": 1, "start_us": 30.0,
         "end_us": 35.0},
        {"lane": "compute", "name": "layer", "layer": 0, "batch": 0, "start_us": 30.0,
         "end_us": 33.0},
        {"lane": "compute", "name": "layer", "layer": 0, "batch": 1, "start_us": 35.0,
         "end_us": 38.0},
    ]


def make_overlap(model="opt-6.7b", batch=16, context=1024, schedule="row", weights="resident",
                  setting="kvpr-pipelined", spans=None):
    return {"model": model, "batch": batch, "context": context, "schedule": schedule,
            "gpu_batches": 1 if schedule == "row" else 2, "weights": weights, "setting": setting,
            "l": 1024, "step_ms": 0.044, "spans": spans or SPANS}


def test_overlap_bars_are_the_spans_on_a_microsecond_axis():
    fig = overlap_figure(SPANS, "measured on TEST GPU")
    assert [t.name for t in fig.data] == ["X", "KV", "recompute", "layer", "new token"]
    bars = {t.name: t for t in fig.data}
    assert list(bars["layer"].base) == [30.5] and list(bars["layer"].x) == [11.75]
    assert list(bars["X"].y) == ["H2D"] and all(t.orientation == "h" for t in fig.data)
    assert fig.layout.xaxis.type in (None, "linear")  # px.timeline would make it "date"
    assert list(fig.layout.yaxis.categoryarray) == ["D2H", "compute", "H2D"]
    assert "0.04 ms" in fig.layout.title.text and "measured on TEST GPU" in fig.layout.title.text
    assert not any("GPU batch" in t.hovertemplate for t in fig.data)
    assert LANE_ORDER == LANES  # the viz keeps its own copy: no torch in the dashboard


def test_overlap_hover_names_the_gpu_batch_and_weights_have_their_colours():
    overlap = make_overlap(schedule="column", weights="offloaded", spans=make_column_spans())
    fig = overlap_figure(overlap["spans"], PROVENANCE, point=describe_point(overlap))
    bars = {t.name: t for t in fig.data}
    assert list(bars) == ["W_KV", "W_rest", "KV", "layer"]
    assert bars["W_KV"].marker.color == OP_COLORS["W_KV"] != OP_COLORS["W_rest"]
    assert bars["W_rest"].marker.color == OP_COLORS["W_rest"]
    assert list(bars["W_rest"].base) == [5.0] and list(bars["W_rest"].x) == [20.0]
    assert "GPU batch %{customdata[4]}" in bars["layer"].hovertemplate
    assert [d[4] for d in bars["layer"].customdata] == [0, 1]
    assert list(fig.layout.yaxis.categoryarray) == ["compute", "H2D"]
    title = fig.layout.title.text
    assert title.startswith("One decode step: 0.04 ms<br><sub>opt-6.7b, batch 16 x 1024, "
                            "column x2, weights offloaded, kvpr-pipelined at l=1024</sub>")
    assert PROVENANCE in title


def test_overlap_without_spans_is_refused():
    with pytest.raises(ValueError, match="spans is empty"):
        overlap_figure([], "x")


def test_split_figure_draws_each_model_and_its_optimum():
    shape = LayerShape(MODELS["opt-6.7b"], batch=16, context=1024)
    fig = split_figure(shape, RATES, selected_l=300)
    curves = [t for t in fig.data if t.name.endswith(" model")]
    optima = [t for t in fig.data if t.name.endswith(" optimum")]
    assert [t.name for t in fig.data][-1] == "chosen l=300"  # the vertical line's legend entry
    assert all(o.marker.color == c.line.color for o, c in zip(optima, curves, strict=True))
    assert [t.name for t in curves] == ["paper model", "chunked model", "pipelined model"]
    for model, marker in zip(("paper", "chunked", "pipelined"), optima, strict=True):
        best = best_split(shape, RATES, model)
        assert list(marker.x) == [best.l]
        assert marker.y[0] == pytest.approx(1e3 * 32 * best.seconds)
    assert len(curves[0].x) == 1025 and [s.x0 for s in fig.layout.shapes] == [300]
    assert "recorded on NVIDIA H200" in fig.layout.title.text


def test_split_figure_draws_rows_of_one_schedule_and_never_hf():
    rows = make_point_rows()
    shape = LayerShape(MODELS["opt-6.7b"], batch=16, context=1024)
    fig = split_figure(shape, RATES, measured=rows, provenance=PROVENANCE)
    (measured,) = [t for t in fig.data if (t.name or "").startswith("measured")]
    assert len(measured.x) == 9 and None not in measured.x  # hf-offloaded has no l
    assert split_points(rows, "column", "offloaded") == []  # recorded in 4 GPU batches, not 1
    points = split_points(rows, "column", "offloaded", gpu_batches=4)
    assert [(r["setting"], r["l"]) for r in points] == [("kvpr-pipelined", 800),
                                                        ("full-transfer", 0)]
    unit = unit_shape(MODELS["opt-6.7b"], 16, 1024, "column", 4, "offloaded")
    fig = split_figure(unit, RATES, measured=points, provenance=PROVENANCE, gpu_batches=4)
    (measured,) = [t for t in fig.data if (t.name or "").startswith("measured")]
    assert list(measured.y) == [60.0, 150.0] and measured.name == "measured (column x4, weights "\
        "offloaded)" and f"x = measured, {PROVENANCE}" in fig.layout.title.text
    assert "batch 16 in 4 GPU batches x 1024 tokens, weights offloaded" in fig.layout.title.text
    # a step is 32 layers x 4 GPU batches, each unit with a quarter of the weight load
    pipelined = next(t for t in fig.data if t.name == "pipelined model")
    assert pipelined.y[0] == pytest.approx(1e3 * 128 * layer_time(unit, RATES, 0, "pipelined"))


def test_rows_recorded_before_the_schedule_keys_read_as_row_by_row_resident():
    old = {k: v for k, v in make_row("kvpr-paper", 1.0).items()
           if k not in ("schedule", "gpu_batches", "weights")}
    assert with_defaults(old) == {**old, "schedule": "row", "gpu_batches": 1,
                                  "weights": "resident"}
    assert schedule_label(old) == "row, weights resident"
    assert schedule_label(make_row("x", 1.0, schedule="column", gpu_batches=4,
                                   weights="offloaded")) == "column x4, weights offloaded"
    assert schedule_label(make_row("x", 1.0, gpu_batches=4)) == "row x4, weights resident"
    assert describe_point(make_row("hf-offloaded", 1.0)) == (
        "opt-6.7b, batch 16 x 1024, row, weights resident, hf-offloaded")


def test_eager_rows_are_labelled_and_left_out_of_the_split_points_beside_graphed_ones():
    graphed, eager = make_row("kvpr-paper", 1.0), make_row("kvpr-paper", 3.0, split=256)
    graphed["cuda_graphs"], eager["cuda_graphs"] = True, False
    assert schedule_label(graphed) == "row, weights resident"
    assert schedule_label(eager) == "row, weights resident, eager"
    assert split_points([graphed, eager]) == [graphed]
    assert split_points([eager]) == [eager]


def test_baseline_speedups_compare_the_fastest_kvpr_split_of_each_group():
    pairs = baseline_speedups(make_point_rows())
    got = {(p["group"], p["baseline"]): (p["setting"], p["l"], p["speedup"]) for p in pairs}
    assert got == {
        ("row, weights resident", "full-transfer"): ("kvpr-pipelined", 1024, 2.0),
        ("row, weights resident", "full-recompute"): ("kvpr-pipelined", 1024, 84.0 / 80.0),
        ("row, weights resident", "hf-offloaded"): ("kvpr-pipelined", 1024, 3.0),
        # HF's cache keeps the weights resident: it is a baseline of the resident groups only
        ("column x4, weights resident", "full-transfer"): ("kvpr-pipelined", 1024, 2.4),
        ("column x4, weights resident", "hf-offloaded"): ("kvpr-pipelined", 1024, 4.8),
        ("column x4, weights offloaded", "full-transfer"): ("kvpr-pipelined", 800, 2.5),
    }


def test_speedup_figure_shows_step_times_per_group_and_speedups_as_text():
    rows = make_point_rows()
    fig = speedup_figure(rows, PROVENANCE)
    steps = [t for t in fig.data if t.xaxis == "x"]
    speedups = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in steps] == ["row, weights resident", "column x4, weights resident",
                                       "column x4, weights offloaded"]
    assert list(steps[0].x) == ["kvpr-paper", "kvpr-chunked", "kvpr-pipelined", "full-transfer",
                                "full-recompute", "hf-offloaded"]
    assert list(steps[0].y) == [100.0, 90.0, 80.0, 160.0, 84.0, 240.0]
    assert list(steps[2].y) == [60.0, 150.0]
    assert list(speedups[0].x) == ["full-transfer", "full-recompute", "hf-offloaded"]
    assert list(speedups[0].text) == ["2.00x", "1.05x", "3.00x"]
    assert list(speedups[1].text) == ["2.40x", "4.80x"] and list(speedups[2].text) == ["2.50x"]
    assert all(not t.showlegend for t in speedups)
    title = fig.layout.title.text
    assert title.startswith("opt-6.7b, batch 16 x 1024") and PROVENANCE in title
    assert "full-transfer, full-recompute, hf-offloaded" in title


def test_speedup_figure_of_the_recorded_result():
    kvpr = load_results(*KVPR)
    point = ("llama2-7b", 16, 512)  # in the grid, kvpr_schedules and kvpr_eager
    rows = [r for r in [*kvpr["rows"], *load_result("h200", "kvpr_eager")["rows"]]
            if (r["model"], r["batch"], r["context"]) == point]
    fig = speedup_figure(rows, label(kvpr))
    groups = list(dict.fromkeys(schedule_label(with_defaults(r)) for r in rows))
    # the grid's row schedule, the column schedule's groups, the grid's point run eagerly
    assert groups[0] == "row, weights resident" and "row, weights resident, eager" in groups
    assert any(g.startswith("column x4") for g in groups)
    assert [t.name for t in fig.data[::2]] == groups and len(fig.data) == 2 * len(groups)
    steps, speedups = fig.data[0], fig.data[1]  # the grid's row schedule, weights resident
    grid = [r for r in rows if schedule_label(with_defaults(r)) == groups[0]]
    assert list(steps.y) == [r["step_ms"] for r in grid]
    best = min(r["step_ms"] for r in grid if r["setting"].startswith("kvpr-"))
    full = next(r["step_ms"] for r in grid if r["setting"] == "full-transfer")
    hf = next(r["step_ms"] for r in grid if r["setting"] == "hf-offloaded")
    assert list(speedups.x) == ["full-transfer", "full-recompute", "hf-offloaded"]
    assert speedups.text[0] == f"{full / best:.2f}x" and speedups.text[2] == f"{hf / best:.2f}x"
    assert "recorded on NVIDIA H200" in fig.layout.title.text


def test_speedup_figure_needs_one_point():
    rows = make_point_rows() + make_point_rows(context=2048)
    with pytest.raises(ValueError, match="rows cover 2 .* points: must cover one"):
        speedup_figure(rows, PROVENANCE)


def test_nearest_overlap_keeps_the_schedule_and_prefers_the_weights():
    overlaps = [make_overlap(context=1024), make_overlap(context=4096),
                make_overlap(context=4096, weights="offloaded"),
                make_overlap(context=1024, schedule="column", spans=make_column_spans())]
    assert nearest_overlap(overlaps, "opt-6.7b", 16, 3000) == overlaps[1]
    assert nearest_overlap(overlaps, "opt-6.7b", 16, 3000, weights="offloaded") == overlaps[2]
    column = nearest_overlap(overlaps, "opt-6.7b", 16, 8192, schedule="column")
    assert column["context"] == 1024 and column["schedule"] == "column"
    assert nearest_overlap(overlaps, "llama3-8b", 16, 1024) is None
    old = [{k: v for k, v in overlaps[0].items() if k not in ("schedule", "weights")}]
    assert nearest_overlap(old, "opt-6.7b", 16, 1024)["spans"] == SPANS
    assert nearest_overlap(old, "opt-6.7b", 16, 1024, schedule="column") is None


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


def test_every_legend_hangs_from_the_bottom_edge_below_the_x_axis():
    """Not a fraction of the plot's height below it: at 420 px, 0.3 of it put the split figure's
    legend on its x axis's title, and 0.4 the speedup figure's on its tick labels
    (kvlab.viz.layout)."""
    shape = LayerShape(MODELS["opt-6.7b"], 16, 1024)
    figures = [split_figure(shape, RATES, 300, height=420),
               speedup_figure(make_point_rows(), PROVENANCE, height=400),
               overlap_figure(SPANS, PROVENANCE, height=360)]
    for fig in figures:
        legend = fig.layout.legend
        assert (legend.yref, legend.y, legend.yanchor) == ("container", 0.0, "bottom")
        assert fig.layout.margin.b is None
    # the setting names turn 45 degrees, or upright, as far as keeps them apart (at 500 px, the
    # 30 degrees Plotly picks alone put "kvpr-paper" on "kvpr-chunked")
    speedup = figures[1].layout
    assert list(speedup.xaxis.autotickangles) == list(speedup.xaxis2.autotickangles) == [45, 90]


def test_gpu_bytes_are_the_runtimes_weights_and_two_buffer_slots():
    model = MODELS["opt-6.7b"]
    layer = layer_weight_bytes(model)[1]
    # a unit of 4 of 16 sequences x 1,024 tokens: K, V 2 x 4 x 1024 x 4096 x 2 B, X half that
    shape = unit_shape(model, 16, 1024, "column", 4, "offloaded")
    slot = 2 * 4 * 1024 * 4096 * 2 + 4 * 1024 * 4096 * 2
    assert gpu_bytes(shape, "offloaded") == (2 * layer, 2 * slot)
    assert gpu_bytes(shape, "resident") == (model.num_layers * layer, 2 * slot)
    with pytest.raises(ValueError, match="weights='host': must be one of"):
        gpu_bytes(shape, "host")
