"""The "End-to-end" tab on the simulated backend: the recorded H200 run of whole models, its
throughput against batch and its decode steps, labelled as recorded."""

import pytest

from kvlab.panels.e2e import EndToEndTab
from kvlab.results import load_result


@pytest.fixture
def tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return EndToEndTab()


def test_the_recorded_run_is_shown_with_its_provenance(tab):
    rows = [r for r in load_result("h200", "e2e")["rows"] if r["model"] == "llama3-8b"]
    throughput = tab.figures["throughput"].figure
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    assert [t.name for t in throughput.data[:-1]] == variants
    assert throughput.data[-1].name.startswith("roofline")
    gqa = sorted((r for r in rows if r["variant"] == "gqa"), key=lambda r: r["batch"])
    assert list(throughput.data[variants.index("gqa")].y) == [r["tokens_per_s"] for r in gqa]
    assert "recorded on NVIDIA H200" in throughput.layout.title.text
    steps = tab.figures["steps"].figure
    assert {t.name for t in steps.data} == set(variants)
    assert "batch 64" in steps.layout.title.text and tab.generate_button is None
    assert "x HF's static cache" in tab.status.value and "fastest" in tab.status.value
    at_64 = {r["variant"]: r["step_ms"] for r in rows if r["batch"] == 64}
    assert (f"gqa+prefetch {at_64['gqa'] / at_64['gqa+prefetch']:.2f}x gqa's speed"
            in tab.status.value)


def test_the_recorded_serving_runs_are_in_the_status_line(tab):
    runs = load_result("h200", "e2e_serving")["serving"]
    assert runs and all(r["model"] == "llama3-8b" for r in runs)
    for r in runs:
        assert (f"Serving {r['requests']} requests arriving at {r['rate']:g}/s (gqa, recorded on "
                in tab.status.value)
        assert f"{r['output_tokens_per_s']:,.0f} output tokens/s" in tab.status.value
    tab.controls["model"].value = "qwen2.5-14b"
    assert "Serving" not in tab.status.value and "qwen2.5-14b batch 64" in tab.status.value


def test_the_batch_control_picks_the_recorded_steps(tab):
    tab.controls["batch"].value = 1
    rows = load_result("h200", "e2e")["rows"]
    hf = next(r for r in rows if r["batch"] == 1 and r["variant"] == "hf-static")
    steps = {t.name: list(t.y) for t in tab.figures["steps"].figure.data}
    assert steps["hf-static"] == hf["step_ms_runs"]


def test_a_model_not_recorded_says_how_to_record_it(tab):
    tab.controls["model"].value = "opt-13b"
    for pane in tab.figures.values():
        notes = [a.text for a in pane.figure.layout.annotations]
        assert any("python -m kvlab bench e2e" in n for n in notes)
    assert tab.status.value == "No end-to-end run recorded."


@pytest.mark.gpu
def test_generate_adds_a_measured_run(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = EndToEndTab(batch=16, new_tokens=8)
    tab.controls["model"].value = "llama3-8b"
    tab.generate()
    names = [t.name for t in tab.figures["steps"].figure.data]
    assert names[0].startswith("kvlab.LLM") and "measured on" in \
        tab.figures["steps"].figure.layout.title.text
    assert len(tab.generated[2].step_ms) == 7
