"""The "L2 and counters" tab, driven without a browser: the paper's counters beside a note where
the H200's are not recorded, the regime map's note, the L2 model on every change (CPU) for the
chosen GPU, a setting no kernel takes named, and ncu on request (wired on the CPU with a
stand-in for ncu; for real on the GPU)."""

import html
import re
import statistics
import time
import types

import plotly.io as pio
import pytest

from kvlab.gpus import GPUS, REFERENCE
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


@pytest.mark.parametrize("controls", [{"batch": 16, "context": 4096},
                                      {"batch": 64, "context": 32768, "gpu": "rtx4090"}])
def test_every_title_line_fits_a_500_px_chart(tab, controls):
    """At 1,000 px JupyterLab gives a chart some 530 px: Plotly cuts a longer line at the edge
    (kvlab.viz.layout: about 45 characters of the title, 70 of a subtitle line)."""
    for name, value in controls.items():
        tab.controls[name].value = value
    for name, pane in tab.figures.items():
        title, *lines = plain_lines(pane.figure)
        assert len(title) <= 45, (name, title)
        assert all(len(line) <= 72 for line in lines), (name, lines)


def test_the_l2_model_is_drawn_without_asking(tab):
    fig = tab.figures["modelled"].figure
    hits = next(t for t in fig.data if t.name.startswith("hits"))
    assert list(hits.x) == ["none", "bulk K+V d=1"]
    assert hits.y[0] == 0.0  # MHA without prefetch: nothing is read twice
    assert fig.layout.title.text.startswith("L2, modelled<br>")
    assert "modelled by kvlab.sim" in fig.layout.title.text
    (time_bars,) = [t for t in fig.data if t.name == "time (time model)"]
    assert list(time_bars.x) == ["none", "bulk K+V d=1"] and all(y > 0 for y in time_bars.y)
    assert "CPI and stalls: ncu only" in fig.layout.title.text
    assert "L2 model: the whole launch replayed on the NVIDIA H200's L2" in html.unescape(
        tab.status.value)
    assert not hasattr(tab, "model_button")
    slower = time_bars.y
    tab.controls["sms"].value = 32
    (time_bars,) = [t for t in tab.figures["modelled"].figure.data
                    if t.name == "time (time model)"]
    assert all(a > b for a, b in zip(time_bars.y, slower, strict=True))  # fewer SMs: slower


def test_block_size_and_prefetch_mode_reach_the_model(tab):
    tab.controls["block_size"].value = 32
    tab.controls["prefetch"].value = "line"
    tab.controls["distance"].value = 2
    fig = tab.figures["modelled"].figure
    hits = next(t for t in fig.data if t.name.startswith("hits"))
    assert list(hits.x) == ["none", "line K+V d=2"]
    assert "block 32" in fig.layout.title.text
    tab.controls["block_size"].value = 64  # gqa's, not vllm_v1's
    (note,) = tab.figures["modelled"].figure.layout.annotations
    assert "block_size=64: must be one of (8, 16, 32) for family=&#x27;vllm_v1&#x27;" in note.text


# every control, and a value for it that changes the launch modelled
CHANGES = [("model", "llama3-8b"), ("gpu", "h100-sxm"), ("kernel", "gqa"), ("batch", 16),
           ("context", 8192), ("block_size", 32), ("sms", 80), ("prefetch", "line"),
           ("distance", 4), ("gpu", "h20"), ("model", "qwen2.5-7b"), ("kernel", "vllm_v1"),
           ("batch", 64), ("context", 2048), ("block_size", 8), ("sms", 40),
           ("prefetch", "bulk"), ("distance", 8)]


def test_every_control_redraws_the_modelled_chart(tab):
    """Each change redraws the L2 model's chart, its bars drawn. The seconds each change takes
    are printed (pytest -s), not asserted."""
    seconds = []
    assert {name for name, _ in CHANGES} == set(tab.controls)
    for name, value in CHANGES:
        before = pio.to_json(tab.figures["modelled"].figure)
        start = time.perf_counter()
        tab.controls[name].value = value
        seconds.append(time.perf_counter() - start)
        fig = tab.figures["modelled"].figure
        assert fig.data and pio.to_json(fig) != before, (name, value)
    print(f"\nrefresh per control change: median {statistics.median(seconds):.3f} s, "
          f"max {max(seconds):.3f} s over {len(seconds)} changes: "
          + ", ".join(f"{n}={v} {s:.3f}" for (n, v), s in zip(CHANGES, seconds, strict=True)))


def test_the_gpu_selector_sets_the_l2_and_the_sms_replayed(tab, monkeypatch):
    from kvlab.sim.l2 import LINE_BYTES, NUM_WAYS
    from kvlab.sim.sample import replay

    replayed = []
    monkeypatch.setattr("kvlab.panels.l2.replay", lambda s: replayed.append(s) or replay(s))
    tab.controls["model"].value, tab.controls["kernel"].value = "llama3-8b", "gqa"
    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096  # replayed whole
    tab.controls["prefetch"].value, tab.controls["distance"].value = "bulk", 8
    hit_rates = {}
    for key in ("h200", "h100-sxm"):  # 132 SMs each; 60 and 50 MiB of L2
        replayed.clear()
        tab.controls["gpu"].value = key
        g = GPUS[key]
        for sample in replayed:
            assert (sample.num_sms, sample.spec.num_sms) == (g.num_sms, g.num_sms)  # whole
            assert sample.num_sets * NUM_WAYS * LINE_BYTES == g.l2_bytes
        fig = tab.figures["modelled"].figure
        hit_rates[key] = next(t for t in fig.data if t.name.startswith("hits")).y[1]
        assert f"its {g.l2_bytes // 2**20} MiB L2" in " ".join(plain_lines(fig)) or (
            key == REFERENCE)
    assert hit_rates["h100-sxm"] < hit_rates["h200"] - 10  # prefetched lines leave a smaller L2


@pytest.mark.parametrize("key", [k for k in GPUS if k != REFERENCE])
def test_another_gpu_is_modelled_for_it_never_measured_or_recorded(tab, key):
    name = GPUS[key].name
    tab.controls["gpu"].value = key
    tab.controls["prefetch"].value = "line"  # every GPU takes it
    modelled = tab.figures["modelled"].figure.layout.title.text
    assert modelled.startswith(f"L2, modelled for {name}<br>")
    assert "recorded" not in modelled.lower() and "measured" not in modelled.lower()
    assert tab.controls["sms"].max == tab.controls["sms"].value == GPUS[key].num_sms
    for chart in ("counters", "regime"):  # the H200's recordings, and said so
        title = tab.figures[chart].figure.layout.title.text
        assert f"the NVIDIA H200's recordings, not modelled for {name}" in title
        assert f"modelled for {name}" not in title.replace(", not modelled for", "")
    status = html.unescape(tab.status.value)
    assert f"counters (the NVIDIA H200's, not modelled for {name})" in status
    assert f"{name}: copy roofline assumed" in status and f"{name}: L2 rate assumed" in status


def test_the_h200_shows_its_recordings_as_recorded(tab):
    for chart in ("counters", "regime"):
        title = tab.figures[chart].figure.layout.title.text
        assert "recorded on NVIDIA H200" in title and "not modelled for" not in title


def test_the_sms_slider_follows_the_gpu(tab):
    sms = tab.controls["sms"]
    tab.controls["prefetch"].value = "line"  # every GPU takes it
    assert (sms.max, sms.value) == (132, 132)
    tab.controls["gpu"].value = "b200"  # all of one GPU's SMs stay all
    assert (sms.max, sms.value) == (148, 148)
    sms.value = 100
    tab.controls["gpu"].value = "h20"  # past the GPU's SMs: clamped
    assert (sms.max, sms.value) == (78, 78)
    sms.value = 40
    tab.controls["gpu"].value = "l40s"  # a part stays as it is
    assert (sms.max, sms.value) == (142, 40)
    assert "40 SMs" in tab.figures["modelled"].figure.layout.title.text


@pytest.mark.parametrize(("controls", "why"), [
    ({"block_size": 64}, "block_size=64: must be one of (8, 16, 32) for family='vllm_v1'"),
    ({"batch": 1024, "context": 131072}, "batch=1024, context=131072: K and V of one layer"),
    ({"gpu": "a100-40gb-pcie", "prefetch": "bulk"}, "prefetch='bulk K+V d=1': "
     "cp.async.bulk.prefetch.L2 needs sm_90"),
])
def test_a_setting_no_kernel_takes_is_named_in_the_status_and_every_chart(tab, controls, why):
    for name, value in controls.items():
        tab.controls[name].value = value
    status = html.unescape(tab.status.value)
    assert status.startswith("no kernel takes this setting on the NVIDIA") and why in status
    for pane in tab.figures.values():
        assert pane.figure.data == ()
        assert why in html.unescape(pane.figure.layout.annotations[0].text.replace("<br>", " "))
    tab.controls["batch"].value, tab.controls["context"].value = 2, 1024
    tab.controls["block_size"].value, tab.controls["prefetch"].value = 16, "line"
    assert tab.figures["modelled"].figure.data  # a setting it takes is modelled again


def test_the_gpu_argument_sets_the_gpu_and_the_sms_it_offers(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = L2Tab(gpu="h20", batch=2, context=1024)
    assert tab.controls["gpu"].value == "h20"
    assert (tab.controls["sms"].max, tab.controls["sms"].value) == (78, 78)
    assert L2Tab(batch=2, context=1024).controls["gpu"].value == REFERENCE  # no GPU in use
    with pytest.raises(ValueError, match=r"num_sms=100: must be an integer in \[8, 78\]"):
        L2Tab(gpu="h20", num_sms=100)
    with pytest.raises(ValueError, match="gpu='tpu': must be one of"):
        L2Tab(gpu="tpu")


def test_the_status_says_how_the_recorded_counters_differ_from_the_controls(tab):
    assert tab.profile_button is None  # no GPU here
    tab.controls["batch"].value, tab.controls["context"].value = 16, 4096
    assert tab.status.value.startswith("counters: recorded at this launch; measuring needs")
    tab.controls["distance"].value = 8  # not profiled
    assert "16 x 4096, block 16, 132 SMs, bulk K+V d=1, the nearest to" in tab.status.value
    counters_line = tab.status.value.split("<br>")[0]
    assert counters_line.endswith("bulk K+V d=8; measuring needs a CUDA GPU and Nsight Compute "
                                  "(ncu)")


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
    monkeypatch.setattr("kvlab.panels.widgets.local_gpu", lambda: GPUS[REFERENCE])
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
    assert tab.status.value.startswith("counters: measured now with ncu, measured on a test GPU")
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


def test_a_launch_too_big_to_replay_whole_is_replayed_as_a_miniature_and_said_so(tab):
    from kvlab.sim.spec import TraceSpec

    tab.controls["batch"].value, tab.controls["context"].value = 64, 32768
    fig = tab.figures["modelled"].figure
    subtitle = " ".join(plain_lines(fig))
    assert re.search(r"replayed on 1 of 64 sequences, \d+ of 32 KV heads on \d+ of 132 SMs with "
                     r"their share of the L2", subtitle)
    assert re.search(r"L2 model: replayed on 1 of 64 sequences, .* with their share of the L2",
                     tab.status.value)
    # the chart's time is the whole launch's: its DRAM bytes, scaled up from the replay's
    whole = TraceSpec(family="vllm_v1", num_seqs=64, context=32768, num_qo_heads=32,
                      num_kv_heads=32, partition_size=512, ctas_per_sm=5)
    assert whole.load_bytes // 32 > 50 * MAX_MODELLED_SECTORS
    (time_bars,) = [t for t in fig.data if t.name == "time (time model)"]
    dram_share = next(t for t in fig.data if t.name == "time (time model)").customdata
    assert all(20 < share <= 100 for share in dram_share)  # the launch's bytes over its time
    assert time_bars.y[0] * 1e-6 * 4800e9 > whole.load_bytes  # at most HBM's 4.8 TB/s


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


def test_the_recorded_charts_are_sent_before_the_l2_model_replays(tab, monkeypatch):
    sent = []
    for name, pane in tab.figures.items():
        pane.observe(lambda change, name=name: sent.append(name), names="outputs")
    modelled = tab._modelled

    def replays(v):
        sent.append("replays")
        return modelled(v)

    monkeypatch.setattr(tab, "_modelled", replays)
    tab.controls["gpu"].value = "h20"  # every chart names the GPU: all three are sent
    assert sent == ["counters", "regime", "replays", "modelled"]
