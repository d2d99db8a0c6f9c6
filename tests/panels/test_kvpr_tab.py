"""The "KVPR" tab: modelled t(l) curves from recorded or what-if rates, recorded steps on top."""

import pytest

from kvlab.config import MODELS
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split
from kvlab.panels import dashboard
from kvlab.panels.kvpr import RECORDED, KVPRTab
from kvlab.results import load_result


@pytest.fixture
def tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return KVPRTab()


def recorded_rows(model, batch, context):
    return [r for r in load_result(*RECORDED)["rows"]
            if (r["model"], r["batch"], r["context"]) == (model, batch, context)]


def test_dashboard_ends_with_the_kvpr_tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dash = dashboard()
    assert dash.tab_widget.titles[-1] == "KVPR"
    assert set(dash.figures["kvpr"]) == {"split", "settings"}


def test_recorded_point_shows_its_rates_and_measured_steps(tab):
    rows = recorded_rows("opt-6.7b", 16, 1024)
    c = tab.controls
    assert c["pcie_gbps"].disabled and c["pcie_gbps"].value == round(rows[0]["h2d_gbps"], 1)
    split = tab.figures["split"]
    measured = [t for t in split.data if (t.name or "").startswith("measured")]
    assert len(measured) == 1 and list(measured[0].y) == [r["step_ms"] for r in rows]
    assert "recorded on NVIDIA H200" in split.layout.title.text
    (bars,) = tab.figures["settings"].data
    full = next(r["step_ms"] for r in rows if r["setting"] == "full-transfer")
    assert list(bars.text) == [f"{full / r['step_ms']:.2f}x" for r in rows]


def test_what_if_rates_move_the_curves(tab):
    c = tab.controls
    c["rates"].value = "what-if"
    assert not c["pcie_gbps"].disabled
    c["pcie_gbps"].value, c["recompute_tflops"].value = 25.0, 300.0
    shape = LayerShape(MODELS["opt-6.7b"], 16, 1024)
    hw = LinkAndCompute(25e9, 300e12, "what-if")
    best = best_split(shape, hw, "pipelined", 4)
    optimum = [t for t in tab.figures["split"].data if t.mode == "markers"][2]
    assert list(optimum.x) == [best.l]
    assert "what-if rates" in tab.figures["split"].layout.title.text
    assert f"l={best.l}" in tab.status.value


def test_unrecorded_model_falls_back_to_what_if_and_says_so(tab):
    tab.controls["model"].value = "qwen2.5-7b"
    assert "nothing recorded" in tab.status.value
    assert tab.figures["settings"].data == ()
    assert "no recorded KVPR steps" in tab.figures["settings"].layout.title.text


def test_gqa_model_recomputes_nothing_and_context_bounds_l(tab):
    c = tab.controls
    c["model"].value = "llama3-8b"
    assert "optimum l=0" in tab.status.value
    c["context"].value = 4096
    assert c["l"].max == 4096
    assert "nearest recorded: batch 16 x 1024" in tab.status.value
