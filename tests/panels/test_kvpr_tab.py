"""The "KVPR" tab: modelled t(l) curves from recorded or what-if rates, recorded steps on top, the
overlap of one recorded step and the speedup over the baselines; on a GPU, a Measure button. Run
on the recorded result and on a synthetic one in the format with schedules, weights and
overlaps."""

import html
import re
import sys
import types

import ipywidgets as widgets
import pytest
from factories import check_imports_leave_out

import kvlab.panels.kvpr as module
import kvlab.panels.widgets
import kvlab.results
from kvlab import gpus
from kvlab.config import MODELS
from kvlab.offload import paper
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split, unit_shape
from kvlab.panels import dashboard
from kvlab.panels.kvpr import KVPRTab
from kvlab.results import KVPR, load_results, nearest_point
from kvlab.viz.offload import gpu_bytes, schedule_label, with_defaults

PROVENANCE = "recorded on TEST GPU, 2026-12-01"


@pytest.fixture
def tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return KVPRTab()


def recorded_rows(model, batch, context):
    return [r for r in load_results(*KVPR)["rows"]
            if (r["model"], r["batch"], r["context"]) == (model, batch, context)]


def make_row(setting, step_ms, split, schedule="row", weights="resident", context=1024):
    """A benchmark row in the format with schedule, gpu_batches and weights (opt-6.7b, batch 16)."""
    return {"model": "opt-6.7b", "batch": 16, "context": context, "h2d_gbps": 50.0,
            "recompute_tflops": 600.0, "setting": setting, "l": split, "step_ms": step_ms,
            "tokens_per_s": 16 / (step_ms * 1e-3), "schedule": schedule,
            "gpu_batches": 1 if schedule == "row" else 4, "weights": weights}


def make_overlap(schedule, weights, start_us, context=1024):
    spans = [{"lane": "H2D", "name": "KV[0:1024]", "layer": 0, "start_us": start_us,
              "end_us": start_us + 10.0},
             {"lane": "compute", "name": "layer", "layer": 0, "start_us": start_us + 10.0,
              "end_us": start_us + 12.0}]
    if weights == "offloaded":
        spans.insert(0, {"lane": "H2D", "name": "W_KV", "layer": 0, "start_us": 0.0,
                         "end_us": start_us})
    if schedule == "column":
        spans = [{**s, "batch": 0} for s in spans]
    return {"model": "opt-6.7b", "batch": 16, "context": context, "schedule": schedule,
            "gpu_batches": 1 if schedule == "row" else 4, "weights": weights,
            "setting": "kvpr-pipelined", "l": 1024, "step_ms": 0.1, "spans": spans}


def make_result():
    """opt-6.7b at 16 x 1024: row and column x4, weights resident and offloaded, HF's cache; one
    overlap per schedule and weights, each starting at its own time (under the recorded key
    "timelines")."""
    rows = [make_row("kvpr-pipelined", 80.0, 1024), make_row("full-transfer", 160.0, 0),
            {**make_row("hf-offloaded", 240.0, None), "h2d_gbps": None},
            make_row("kvpr-pipelined", 50.0, 1024, "column"),
            make_row("full-transfer", 120.0, 0, "column"),
            make_row("kvpr-pipelined", 60.0, 800, "column", "offloaded"),
            make_row("full-transfer", 150.0, 0, "column", "offloaded")]
    overlaps = [make_overlap("row", "resident", 1.0), make_overlap("column", "resident", 2.0),
                make_overlap("column", "offloaded", 3.0)]
    return {"gpu": "TEST GPU", "date": "2026-12-01T00:00:00+00:00", "rows": rows,
            "timelines": overlaps}


@pytest.fixture
def new_tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setattr(kvlab.results, "load_recorded",
                        lambda machine, names, keys: make_result())
    return KVPRTab()


def descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)


def test_dashboard_has_the_kvpr_tab_third(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dash = dashboard()
    assert dash.tab_widget.titles[2] == "KVPR"
    assert list(dash.figures["kvpr"]) == ["split", "overlap", "speedup"]


def test_recorded_point_shows_its_rates_and_measured_steps(tab):
    rows = recorded_rows("opt-6.7b", 16, 1024)
    c = tab.controls
    assert c["pcie_gbps"].disabled and c["pcie_gbps"].value == round(rows[0]["h2d_gbps"], 1)
    split = tab.figures["split"].figure
    measured = [t for t in split.data if (t.name or "").startswith("measured")]
    kvpr_rows = [r for r in rows if r["l"] is not None  # HF's row has no split
                 and (r["schedule"], r["gpu_batches"], r["weights"]) == ("row", 1, "resident")]
    assert len(measured) == 1 and list(measured[0].y) == [r["step_ms"] for r in kvpr_rows]
    assert "recorded on NVIDIA H200" in split.layout.title.text
    # one pair of bar traces per schedule group: here only the grid's (row x1, with HF)
    groups = {(r["schedule"], r["gpu_batches"], r["weights"]) for r in rows}
    assert groups == {("row", 1, "resident")} and len(tab.figures["speedup"].figure.data) == 2
    steps, speedups = tab.figures["speedup"].figure.data[:2]
    row = [r for r in rows if (r["schedule"], r["gpu_batches"], r["weights"]) == (
        "row", 1, "resident")]
    assert steps.name == "row, weights resident"
    assert list(steps.y) == [r["step_ms"] for r in row]
    full = next(r["step_ms"] for r in row if r["setting"] == "full-transfer")
    best = min(r["step_ms"] for r in row if r["setting"].startswith("kvpr-"))
    assert speedups.x[0] == "full-transfer" and speedups.text[0] == f"{full / best:.2f}x"
    assert "recorded on NVIDIA H200" in tab.figures["speedup"].figure.layout.title.text
    assert "Steps shown: opt-6.7b batch 16 x 1024 (recorded on NVIDIA H200" in tab.status.value
    # a point kvpr_schedules recorded too: the grid's group first, then its column groups
    c["model"].value, c["context"].value = "llama2-7b", 512
    rows = recorded_rows("llama2-7b", 16, 512)
    groups = list(dict.fromkeys(schedule_label(with_defaults(r)) for r in rows))
    assert groups[0] == "row, weights resident" and len(groups) >= 3
    data = tab.figures["speedup"].figure.data
    assert [t.name for t in data[::2]] == groups and len(data) == 2 * len(groups)
    for steps, group in zip(data[::2], groups, strict=True):
        assert list(steps.y) == [r["step_ms"] for r in rows
                                 if schedule_label(with_defaults(r)) == group]
    assert "Steps shown: llama2-7b batch 16 x 512 (recorded on NVIDIA H200" in tab.status.value


def test_recorded_schedules_are_offered_and_the_recorded_overlap_shown(tab):
    c = tab.controls
    assert c["schedule"].options == ("row", "column")
    assert c["weights"].options == ("resident", "offloaded")
    assert tab.measure_button is None and tab.progress is None
    assert not any(isinstance(w, widgets.Button) for w in descendants(tab.widget))
    gantt = tab.figures["overlap"].figure
    title = gantt.layout.title.text
    assert "<sub>opt-6.7b, batch 16 x 1024, row, weights resident, kvpr-pipelined" in title
    assert "recorded on NVIDIA H200" in title and len(gantt.data) >= 4
    c["model"].value = "llama2-7b"
    c["schedule"].value, c["weights"].value = "column", "offloaded"
    gantt = tab.figures["overlap"].figure
    column = [t for t in map(with_defaults, load_results(*KVPR)["timelines"])
              if (t["model"], t["schedule"]) == ("llama2-7b", "column")]
    if column:  # a recorded column step, its weights crossing the link where they were offloaded
        assert "column x4, weights " in gantt.layout.title.text
        if any(t["weights"] == "offloaded" for t in column):
            assert "weights offloaded" in gantt.layout.title.text
            assert {"W_KV", "W_rest"} <= {t.name for t in gantt.data}
    else:  # kvpr_schedules recorded no overlaps
        assert gantt.data == ()
        (note,) = gantt.layout.annotations
        assert "llama2-7b, column schedule: no decode-step overlap recorded" in note.text
    c["schedule"].value = "row"  # the grid's step, weights resident: the nearest recorded
    title = tab.figures["overlap"].figure.layout.title.text
    assert "<sub>llama2-7b, batch 16 x 1024, row, weights resident, kvpr-pipelined" in title
    c["schedule"].value = "column"
    c["model"].value = "opt-13b"  # no column run recorded for it
    assert tab.figures["overlap"].figure.data == ()
    (note,) = tab.figures["overlap"].figure.layout.annotations
    assert "no decode-step overlap recorded" in note.text
    assert "Overlap: none of opt-13b with the column schedule" in tab.status.value


def test_what_if_rates_move_the_curves(tab):
    c = tab.controls
    c["rates"].value = "what-if"
    assert not c["pcie_gbps"].disabled
    c["pcie_gbps"].value, c["recompute_tflops"].value = 25.0, 300.0
    shape = LayerShape(MODELS["opt-6.7b"], 16, 1024)
    rates = LinkAndCompute(25e9, 300e12, "what-if")
    best = best_split(shape, rates, "pipelined", 4)
    optimum = [t for t in tab.figures["split"].figure.data if t.mode == "markers"][2]
    assert list(optimum.x) == [best.l]
    assert "what-if rates" in tab.figures["split"].figure.layout.title.text
    assert f"l={best.l}" in tab.status.value


def test_unrecorded_model_falls_back_to_what_if_and_says_so(tab):
    c = tab.controls
    tab.controls["model"].value = "qwen2.5-7b"
    assert "no rates recorded" in tab.status.value
    # the toggle never claims "recorded" for rates it did not record, nor keeps opt-6.7b's
    assert c["rates"].value == "what-if" and c["rates"].disabled
    assert (c["pcie_gbps"].value, c["recompute_tflops"].value) == (55.0, 500.0)
    assert not c["pcie_gbps"].disabled
    assert "what-if rates" in tab.figures["split"].figure.layout.title.text
    assert tab.figures["speedup"].figure.data == ()
    assert "no recorded KVPR steps" in tab.figures["speedup"].figure.layout.annotations[0].text
    c["model"].value = "opt-6.7b"  # recorded again: recorded rates again
    assert c["rates"].value == "recorded" and not c["rates"].disabled
    assert c["pcie_gbps"].disabled


def test_gqa_model_recomputes_nothing_and_context_bounds_l(tab):
    c = tab.controls
    c["model"].value = "llama3-8b"
    assert "optimum l=0" in tab.status.value
    c["context"].value = 4096
    assert c["l"].max == 4096
    assert "Steps shown: llama3-8b batch 16 x 4096" in tab.status.value
    points = [r for r in tab.figures["split"].figure.data if (r.name or "").startswith("measured")]
    kvpr = [r for r in recorded_rows("llama3-8b", 16, 4096) if r["setting"].startswith("kvpr-")]
    assert kvpr and all(r["l"] == 0 for r in kvpr) and 0 in list(points[0].x)
    c["batch"].value = 48  # not recorded: the nearest recorded point is shown, and said
    b, n = nearest_point(load_results(*KVPR), "llama3-8b", 48, 4096)
    assert (b, n) != (48, 4096) and f"nearest recorded: batch {b} x {n}" in tab.status.value


def test_schedule_and_weights_pick_the_overlap_and_the_measured_points(new_tab):
    c = new_tab.controls
    assert c["schedule"].options == ("row", "column")
    assert c["weights"].options == ("resident", "offloaded")
    assert c["pcie_gbps"].value == 50.0  # from a KVPR row, not HF's (no rates)
    gantt = new_tab.figures["overlap"].figure
    assert [t.name for t in gantt.data] == ["KV", "layer"] and list(gantt.data[0].base) == [1.0]
    title = gantt.layout.title.text
    assert "<sub>opt-6.7b, batch 16 x 1024, row, weights resident, kvpr-pipelined" in title
    assert PROVENANCE in title
    c["schedule"].value = "column"
    assert list(new_tab.figures["overlap"].figure.data[0].base) == [2.0]
    assert "GPU batch" in new_tab.figures["overlap"].figure.data[0].hovertemplate
    measured = [t for t in new_tab.figures["split"].figure.data
                if (t.name or "").startswith("measured")]
    assert list(measured[0].y) == [50.0, 120.0]
    assert "column x4, weights resident" in measured[0].name
    assert "in 4 GPU batches" in new_tab.figures["split"].figure.layout.title.text
    c["weights"].value = "offloaded"
    gantt = new_tab.figures["overlap"].figure
    assert [t.name for t in gantt.data] == ["W_KV", "KV", "layer"]
    assert list(gantt.data[1].base) == [3.0]
    assert "Overlap: opt-6.7b, batch 16 x 1024, column x4, weights offloaded" in (
        new_tab.status.value)
    assert "(column x4, weights offloaded)" in new_tab.status.value  # the modelled optimum's
    c["batch"].value = 6
    assert "batch 6 does not split into 4 GPU batches: modelled as one" in new_tab.status.value
    assert "in 4 GPU batches" not in new_tab.figures["split"].figure.layout.title.text


def test_recorded_layer_and_host_times_enter_the_pipelined_curve(monkeypatch):
    """Rows with the layer's and the host's times: with recorded rates the pipelined optimum
    cannot be faster than the host's time per unit; with what-if rates they are left out."""
    result = make_result()
    for row in result["rows"]:
        row.update(layer_ms=0.2, unit_host_ms=3.0, chunk_host_ms=1.0)
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setattr(kvlab.results, "load_recorded", lambda machine, names, keys: result)
    tab = KVPRTab()
    layers = MODELS["opt-6.7b"].num_layers

    def optimum_ms():
        (pipelined,) = [t for t in tab.figures["split"].figure.data if t.name == "pipelined model"]
        return min(pipelined.y)

    # l = 0 is link-bound (5.4 ms a layer); any l > 0 costs the host 3 + 1 ms (one chunk)
    assert optimum_ms() == pytest.approx(layers * 4.0)
    assert "the host 3.00 ms to enqueue it, 1.00 ms more per recompute chunk" in tab.status.value
    tab.controls["rates"].value = "what-if"
    assert optimum_ms() < layers * 4.0
    assert "to enqueue it" not in tab.status.value


def test_speedup_figure_compares_every_group_with_its_baselines(new_tab):
    speedups = [t for t in new_tab.figures["speedup"].figure.data if t.xaxis == "x2"]
    assert [list(t.text) for t in speedups] == [["2.00x", "3.00x"], ["2.40x", "4.80x"],
                                                 ["2.50x"]]
    assert PROVENANCE in new_tab.figures["speedup"].figure.layout.title.text


def test_the_tab_builds_without_importing_torch():
    check_imports_leave_out("from kvlab.panels.kvpr import KVPRTab\nKVPRTab()", ("torch",))


def fake_bench(monkeypatch, measure_point):
    """The cuda path without a GPU: `kvlab.bench.kvpr` (torch) replaced by a module that has only
    `measure_point`."""
    monkeypatch.setitem(sys.modules, "kvlab.bench.kvpr",
                        types.SimpleNamespace(measure_point=measure_point))
    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")


def test_measure_button_shows_the_measured_point(monkeypatch):
    calls = []

    def measure_point(name, batch, context, *, schedule="row", gpu_batches=1,
                      weights="resident", steps=5, chunks=4, hf=False, progress=None):
        calls.append((name, batch, context, schedule, gpu_batches, weights, steps, chunks, hf))
        progress(1, 2)
        progress(2, 2)
        rows = [{**r, "context": context, "step_ms": r["step_ms"] / 2}
                for r in make_result()["rows"] if r["schedule"] == schedule]
        return {"rows": rows, "overlap": make_overlap(schedule, "resident", 7.0, context)}

    fake_bench(monkeypatch, measure_point)
    tab = KVPRTab(context=2048)
    assert tab.controls["schedule"].options == ("row", "column")  # a GPU can run both
    assert "press Measure" in tab.status.value
    assert "recorded on NVIDIA H200" in tab.figures["speedup"].figure.layout.title.text
    assert tab.controls["gpu_batches"].disabled  # row-by-row: one GPU batch
    tab.controls["schedule"].value = "column"
    assert not tab.controls["gpu_batches"].disabled
    tab.controls["hf"].value = True
    tab.measure_button.click()
    assert calls == [("opt-6.7b", 16, 2048, "column", module.COLUMN_GPU_BATCHES, "resident",
                      module.MEASURE_STEPS, 1, True)]
    assert (tab.progress.value, tab.progress.max) == (2, 2)
    assert not tab.measure_button.disabled and "press Measure" not in tab.status.value
    gantt = tab.figures["overlap"].figure
    assert list(gantt.data[0].base) == [7.0]
    assert "measured on FAKE GPU" in gantt.layout.title.text
    steps = [t for t in tab.figures["speedup"].figure.data if t.xaxis == "x"]
    assert list(steps[0].y) == [25.0, 60.0]
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text
    measured = [t for t in tab.figures["split"].figure.data
                if (t.name or "").startswith("measured")]
    assert list(measured[0].y) == [25.0, 60.0]  # at the requested shape: drawn
    tab.controls["chunks"].value = 8  # measured with 1 chunk: back to the recorded point
    assert "recorded on NVIDIA H200" in tab.figures["speedup"].figure.layout.title.text
    tab.controls["chunks"].value = 1
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text


def test_a_failed_measurement_is_shown_in_the_status(monkeypatch):
    def measure_point(name, batch, context, **kwargs):
        raise RuntimeError("host store of 300 GiB > 100 GiB")

    fake_bench(monkeypatch, measure_point)
    tab = KVPRTab()
    tab.measure_button.click()
    assert "measuring failed" in tab.status.value and "300 GiB" in tab.status.value
    assert not tab.measure_button.disabled and tab.measured == {}


@pytest.mark.gpu
def test_measure_button_measures_on_this_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    import torch

    tab = KVPRTab(model="tiny-llama", batch=4, context=64)
    assert "press Measure" in tab.status.value
    tab.measure_button.click()
    assert "measuring failed" not in tab.status.value
    (measured,) = tab.measured.values()
    assert {r["setting"] for r in measured["rows"]} >= {"kvpr-pipelined", "full-transfer"}
    label = f"measured on {torch.cuda.get_device_name()}"
    assert label in tab.figures["speedup"].figure.layout.title.text
    assert label in tab.figures["overlap"].figure.layout.title.text
    assert tab.progress.value == tab.progress.max > 0


def optima(tab) -> dict[str, int]:
    """Each model of time's optimum l in the split figure."""
    return {t.name.removesuffix(" optimum"): t.x[0] for t in tab.figures["split"].figure.data
            if (t.name or "").endswith(" optimum")}


def says_measured_or_recorded(text: str) -> list[str]:
    """Where `text` says "measured" or "recorded" but of the H200's measured shares of its spec
    that kvlab.gpus' assumptions start from."""
    return re.findall(r"\b(?:measured|recorded)\b", html.unescape(text).replace(
        "H200's measured", ""))


def test_another_gpu_models_the_split_with_its_assumed_rates(monkeypatch):
    """KVPR's Table 1 setting (OPT-6.7B, 32 x 1,024, one A100 40GB PCIe): the split figure's
    optima are kvlab.offload.paper's, whose rates are kvlab.gpus'; the H200's are not."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = KVPRTab(batch=32, gpu=paper.PAPER_GPU)
    c = tab.controls
    h2d, h2d_why = gpus.h2d_gbps(paper.PAPER_GPU)
    tflops, tflops_why = gpus.recompute_tflops(paper.PAPER_GPU)
    assert h2d_why.startswith("assumed:") and tflops_why.startswith("assumed:")
    assert c["rates"].options == ("assumed", "what-if") and c["rates"].value == "assumed"
    assert c["pcie_gbps"].disabled and c["pcie_gbps"].value == round(h2d, 1)
    assert c["recompute_tflops"].value == round(tflops)
    predicted = paper.predict("opt-6.7b", paper.PAPER_GPU, "h200-share")
    shown = optima(tab)
    assert (shown["paper"], shown["pipelined"]) == (predicted.split_paper.l,
                                                    predicted.split_pipelined.l)
    (pipelined,) = [t for t in tab.figures["split"].figure.data if t.name == "pipelined model"]
    layers = MODELS["opt-6.7b"].num_layers
    assert min(pipelined.y) == pytest.approx(1e3 * layers * predicted.split_pipelined.seconds)
    status = html.unescape(tab.status.value)
    assert f"Rates assumed for the NVIDIA A100-PCIE-40GB: PCIe H2D {h2d:.1f} GB/s" in status
    assert h2d_why in status and tflops_why in status
    assert "modelled for NVIDIA A100-PCIE-40GB" in tab.figures["split"].figure.layout.title.text
    c["gpu"].value = gpus.REFERENCE  # the H200: its recorded rates at the nearest point
    assert c["rates"].options == ("recorded", "what-if") and c["rates"].value == "recorded"
    assert c["pcie_gbps"].value > 50 and optima(tab)["paper"] != predicted.split_paper.l
    assert "recorded on NVIDIA H200" in tab.figures["split"].figure.layout.title.text


@pytest.mark.parametrize("gpu", ["a100-40gb-pcie", "h100-sxm", "rtx4090", "gh200"])
def test_another_gpu_is_modelled_for_it_never_measured_or_recorded(tab, gpu):
    c = tab.controls
    name = gpus.GPUS[gpu].name
    for rates in ("recorded", "what-if"):  # what the toggle showed on the H200
        c["gpu"].value = gpus.REFERENCE
        c["rates"].value = rates
        c["gpu"].value = gpu
        assert c["rates"].value == ("assumed" if rates == "recorded" else "what-if")
        for pane in tab.figures.values():
            title = pane.figure.layout.title.text
            assert f"modelled for {name}" in title
            assert not re.search(r"measured|recorded", title), title
        split = tab.figures["split"].figure
        assert not any((t.name or "").startswith("measured") for t in split.data)
        assert tab.figures["overlap"].figure.data == tab.figures["speedup"].figure.data == ()
        assert f"modelled for {name}" in tab.status.value
        assert says_measured_or_recorded(tab.status.value) == []
    c["gpu"].value = gpus.REFERENCE  # the what-if rates stay what-if; the recordings return
    assert c["rates"].options == ("recorded", "what-if") and c["rates"].value == "what-if"
    assert "recorded on NVIDIA H200" in tab.figures["speedup"].figure.layout.title.text


def test_a_model_past_the_gpus_memory_is_a_status_message(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = KVPRTab(model="opt-30b", gpu="a100-40gb-pcie")
    weights, buffers = gpu_bytes(unit_shape(MODELS["opt-30b"], 16, 1024), "resident")
    assert weights > 40e9 > weights / MODELS["opt-30b"].num_layers * 2 + buffers
    status = html.unescape(tab.status.value)
    assert ("opt-30b at batch 16 x 1024 with weights resident does not fit the NVIDIA "
            f"A100-PCIE-40GB: KVPR's runtime keeps at least {(weights + buffers) / 1e9:,.1f} GB "
            f"on it ({weights / 1e9:,.1f} GB of weights") in status
    assert "past its 40 GB: offload the weights" in status and "optimum" not in status
    split = tab.figures["split"].figure
    assert split.data == () and "does not fit" in split.layout.annotations[0].text
    tab.controls["weights"].value = "offloaded"  # two layers' weights on the GPU: it fits
    assert "does not fit" not in tab.status.value and "Pipelined optimum" in tab.status.value
    assert len(tab.figures["split"].figure.data) > 0
    tab.controls["gpu"].value = gpus.REFERENCE
    tab.controls["weights"].value = "resident"
    assert "does not fit" not in tab.status.value


def test_an_unknown_gpu_is_refused(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(ValueError, match="gpu='a100': must be one of"):
        KVPRTab(gpu="a100")


def test_on_a_gpu_another_gpu_shows_its_model_not_the_measurement(monkeypatch):
    """This machine's GPU an H100 SXM: what Measure measured shows under it, and only there."""

    def measure_point(name, batch, context, **kwargs):
        return {"rows": [{**r, "step_ms": r["step_ms"] / 2} for r in make_result()["rows"]
                         if r["schedule"] == "row"], "overlap": None}

    fake_bench(monkeypatch, measure_point)
    here = gpus.GPUS["h100-sxm"]
    monkeypatch.setattr(kvlab.panels.widgets, "local_gpu", lambda: here)
    tab = KVPRTab()
    assert tab.controls["gpu"].value == tab.local_gpu == "h100-sxm"
    assert "modelled for NVIDIA H100 80GB HBM3" in tab.figures["split"].figure.layout.title.text
    tab.measure_button.click()
    speedup = tab.figures["speedup"].figure.layout.title.text
    assert "measured on FAKE GPU" in speedup and tab.controls["rates"].value == "recorded"
    tab.controls["gpu"].value = "a100-40gb-pcie"
    assert tab.measure_button.disabled
    assert "select the NVIDIA H100 80GB HBM3 to use it" in tab.status.value
    for pane in tab.figures.values():
        assert "modelled for NVIDIA A100-PCIE-40GB" in pane.figure.layout.title.text
        assert "FAKE GPU" not in pane.figure.layout.title.text
    tab.controls["gpu"].value = "h100-sxm"
    assert not tab.measure_button.disabled
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text
