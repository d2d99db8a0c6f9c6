"""The "L2 and counters" tab, driven without a browser: the paper's counters beside a note where
the H200's are not recorded, the regime map's note, the L2 model on request (CPU), and ncu on
request (wired on the CPU with a stand-in for ncu; for real on the GPU)."""

import types

import pytest

from kvlab.panels.l2 import MAX_MODELLED_SECTORS, L2Tab
from kvlab.profile import CountersError, paper


@pytest.fixture
def tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return L2Tab(batch=2, context=1024)


def test_the_papers_counters_are_drawn_and_the_h200s_named_where_missing(tab):
    fig = tab.figures["counters"].figure
    h20 = [t for t in fig.data if t.name == "H20 (paper), no prefetch"]
    assert list(h20[0].y)[0] == paper.TABLE_5_2["l2_hit_pct"]["llama2-7b"][0]
    title = fig.layout.title.text
    if tab.counters is None:
        assert "H200: not recorded for llama2-7b; run on a GPU:" in title
        assert "python -m kvlab bench counters --models llama2-7b" in title
    assert "arXiv 2504.06319" in title


@pytest.mark.parametrize("model", ["opt-6.7b", "opt-13b", "tiny-llama", "llama2-13b"])
def test_a_model_neither_the_paper_nor_the_h200_has_says_so(tab, model):
    """A note titled by what it would show, not "The paper's counters" over empty axes; the
    status line no longer names another model's recorded point."""
    tab.controls["model"].value = model
    fig = tab.figures["counters"].figure
    assert fig.data == ()
    assert fig.layout.title.text.startswith(f"Table 5.2's counters: {model}<br>")
    (note,) = fig.layout.annotations
    assert f"the paper has no {model}" in note.text
    assert f"python -m kvlab bench counters --models {model}" in note.text
    assert tab.status.value.startswith(f"counters: none recorded for {model}, vllm_v1;")


def plain_lines(fig) -> list[str]:
    return [line.replace("<sub>", "").replace("</sub>", "")
            for line in fig.layout.title.text.split("<br>")]


def test_every_title_line_fits_a_500_px_chart(tab):
    """At 1,000 px JupyterLab gives a chart some 530 px: Plotly cuts a longer line at the edge
    (kvlab.viz.layout: about 45 characters of the title, 70 of a subtitle line)."""
    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096
    tab.model()
    for name, pane in tab.figures.items():
        title, *lines = plain_lines(pane.figure)
        assert len(title) <= 45, (name, title)
        assert all(len(line) <= 72 for line in lines), (name, lines)


def test_the_l2_model_runs_on_request_and_a_change_clears_it(tab):
    assert "press Model the L2" in tab.figures["modelled"].figure.layout.annotations[0].text
    tab.model()
    fig = tab.figures["modelled"].figure
    hits = next(t for t in fig.data if t.name.startswith("hits"))
    assert list(hits.x) == ["none", "bulk K+V d=1"]
    assert hits.y[0] == 0.0  # MHA without prefetch: nothing is read twice
    assert "modelled by kvlab.sim" in fig.layout.title.text
    (time,) = [t for t in fig.data if t.name == "time (time model)"]
    assert list(time.x) == ["none", "bulk K+V d=1"] and all(y > 0 for y in time.y)
    assert "CPI and stalls: ncu only" in fig.layout.title.text
    tab.controls["sms"].value = 32
    assert "press Model the L2" in tab.figures["modelled"].figure.layout.annotations[0].text


def test_block_size_and_prefetch_mode_reach_the_model(tab):
    tab.controls["block_size"].value = 32
    tab.controls["prefetch"].value = "line"
    tab.controls["distance"].value = 2
    tab.model()
    fig = tab.figures["modelled"].figure
    hits = next(t for t in fig.data if t.name.startswith("hits"))
    assert list(hits.x) == ["none", "line K+V d=2"]
    assert "block 32" in fig.layout.title.text
    tab.controls["block_size"].value = 64  # gqa's, not vllm_v1's
    tab.model()
    (note,) = tab.figures["modelled"].figure.layout.annotations
    assert "vllm_v1 runs block sizes (8, 16, 32), not 64" in note.text


def test_the_status_says_how_the_recorded_counters_differ_from_the_controls(tab):
    assert tab.profile_button is None  # no GPU here
    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096
    assert tab.status.value.startswith("counters: recorded at this launch; measuring needs")
    tab.controls["distance"].value = 8  # not profiled
    assert "16 x 4096, block 16, 132 SMs, bulk K+V d=1, the nearest to" in tab.status.value
    assert tab.status.value.endswith("bulk K+V d=8; measuring needs a CUDA GPU and Nsight "
                                     "Compute (ncu)")


def test_recorded_counters_of_other_prefetch_settings_and_block_sizes_are_shown(tab):
    from kvlab.results import load_result

    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096
    tab.controls["kernel"].value = "gqa"
    for block, prefetch, distance, name in ((16, "bulk", 4, "counters_prefetch"),
                                            (16, "line", 1, "counters_prefetch"),
                                            (32, "bulk", 1, "counters_block32")):
        tab.controls["block_size"].value = block
        tab.controls["prefetch"].value, tab.controls["distance"].value = prefetch, distance
        label = f"{prefetch} K+V d={distance}"
        assert tab.status.value.startswith("counters: recorded at this launch")
        want = next(e["ours_prefetch"] for e in load_result("h200", name)["table"] if (
            e["model"], e["kernel"], e["batch"], e["block_size"], e["prefetch"], e["column"])
            == ("llama2-7b", "gqa", 16, block, label, "l2_hit_pct"))
        fig = tab.figures["counters"].figure
        ours = next(t for t in fig.data if t.name == "H200, prefetch")
        assert list(ours.y)[0] == pytest.approx(want)
        assert label in fig.layout.title.text


def _gpu_tab(monkeypatch, measure) -> L2Tab:
    """The tab as on a GPU with ncu, with `measure` standing in for measure_many."""
    import torch

    monkeypatch.setenv("KVLAB_BACKEND", "cuda")
    monkeypatch.setattr("kvlab.panels.l2.shutil.which", lambda name: f"/opt/{name}")
    monkeypatch.setattr("kvlab.panels.l2.backend", lambda: "cuda")
    monkeypatch.setattr("kvlab.panels.l2.device_label", lambda: "measured on a test GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr("kvlab.profile.measure_many", measure)
    return L2Tab(batch=16, context=4096)


def test_profile_with_ncu_shows_what_it_measured(monkeypatch):
    from kvlab.results import load_result

    recorded = {(r["model"], r["kernel"], r["batch"], r["context"], r["num_sms_used"],
                 r["prefetch"]): r for r in load_result("h200", "counters_sms")["rows"]}
    asked = []

    def measure(specs, timeout_s):
        asked.extend(specs)
        return [{**{k: v for k, v in recorded[("llama2-7b", "vllm_v1", 16, 4096, 80,
                                                spec.prefetch)].items() if k != "model"},
                 "l2_hit_pct": 10.0 + i} for i, spec in enumerate(specs)]

    tab = _gpu_tab(monkeypatch, measure)
    tab.controls["sms"].value = 80
    tab.profile()
    assert [(s.prefetch, s.num_sms, s.block_size) for s in asked] == [
        ("none", 80, 16), ("bulk K+V d=1", 80, 16)]
    fig = tab.figures["counters"].figure
    hit_rates = {t.name: list(t.y)[0] for t in fig.data[::-1] if t.name.startswith("H200")}
    assert hit_rates == {"H200, no prefetch": 10.0, "H200, prefetch": 11.0}  # first subplot
    assert "measured on a test GPU, ncu" in fig.layout.title.text
    assert tab.status.value == "counters: measured now with ncu, measured on a test GPU"
    tab.controls["sms"].value = 132  # a changed control drops what was measured
    assert tab.status.value.startswith("counters: recorded")


def test_profile_with_ncu_says_why_it_gave_nothing(monkeypatch):
    def measure(specs, timeout_s):
        raise CountersError("ncu ran past timeout_s=600; killed it", "timeout")

    tab = _gpu_tab(monkeypatch, measure)
    tab.profile()
    assert tab.status.value == "ncu gave no counters: ncu ran past timeout_s=600; killed it"
    assert "H200 recorded on NVIDIA H200" in tab.figures["counters"].figure.layout.title.text


@pytest.mark.gpu
def test_profile_with_ncu_on_this_gpu(monkeypatch):
    import shutil

    if shutil.which("ncu") is None:
        pytest.skip("Nsight Compute (ncu) not on PATH")
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = L2Tab(batch=2, context=1024, kernel="gqa")
    tab.profile()
    assert tab.status.value.startswith("counters: measured now with ncu, measured on")
    fig = tab.figures["counters"].figure
    ours = [t for t in fig.data if t.name.startswith("H200")]
    assert len(ours) == 4 and all(v is not None and v >= 0 for t in ours for v in t.y)


def test_a_launch_too_big_to_model_live_is_a_note(tab):
    tab.controls["batch"].value = 1024
    tab.controls["context"].value = 131072
    tab.model()
    (note,) = tab.figures["modelled"].figure.layout.annotations
    assert "too many to model live here" in note.text
    assert MAX_MODELLED_SECTORS < 1024 * 131072 * 32 * 128 * 4 // 32


def test_the_recorded_counters_follow_the_sm_count_asked_for(tab):
    from kvlab.results import load_result

    recorded = load_result("h200", "counters_sms")
    assert tab.counters["date"] == recorded["date"]
    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096
    for sms, held in ((132, 132), (78, 80), (40, 32)):
        tab.controls["sms"].value = sms
        fig = tab.figures["counters"].figure
        assert f"batch 16 x 4096, {held} SMs" in fig.layout.title.text
        ours = next(t for t in fig.data if t.name == "H200, no prefetch")
        want = next(e["ours_baseline"] for e in recorded["table"] if (
            e["model"], e["kernel"], e["batch"], e["context"], e["num_sms_used"], e["column"]) == (
            "llama2-7b", "vllm_v1", 16, 4096, held, "l2_hit_pct"))
        assert list(ours.y)[0] == pytest.approx(want)


@pytest.mark.parametrize("kernel", ["vllm_v1", "gqa"])
def test_the_regime_map_draws_the_recorded_sm_scaling(monkeypatch, kernel):
    from kvlab.results import load_result

    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    recorded = load_result("h200", "attention_sms")
    tab = L2Tab(kernel=kernel, batch=16, context=4096)
    assert tab.regime["date"] == recorded["date"]
    (heatmap,) = tab.figures["regime"].figure.data
    assert list(heatmap.y) == ["32 SMs", "80 SMs", "132 SMs"]  # the SMs held, 78 asked -> 80
    assert len(heatmap.x) == 24  # 4 models x batch 1/16/64 x context 4k/32k
    assert all(v is not None for row in heatmap.z for v in row)
    assert {t for row in heatmap.customdata for t in row} == {"bulk K+V d=1", "line K+V d=1"}
