"""The "End-to-end" tab on the simulated backend: the recorded H200 run of whole models, its
throughput against batch and its decode steps, labelled as recorded; and for another GPU, the
same modelled for it, labelled so."""

import html
import json
import re
import shutil
import types

import pytest

import kvlab.panels.e2e as module
import kvlab.panels.widgets
import kvlab.results
from kvlab import gpus
from kvlab.config import MODELS
from kvlab.panels.e2e import FIGURE_HEIGHTS, EndToEndTab
from kvlab.results import load_result, results_dir


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
    assert tab.status.value == "No end-to-end run of opt-13b recorded."


def titles(tab) -> dict[str, str]:
    return {name: pane.figure.layout.title.text.split("<br>")[0]
            for name, pane in tab.figures.items()}


WHAT_EACH_SHOWS = {"throughput": "Decode throughput: {model}",
                   "steps": "Decode steps: {model}, batch {batch}",
                   "tensor_parallel": "Tensor parallel: {model}, batch {batch}",
                   "anatomy": "Where a step's HBM idles: {model}, batch {batch}",
                   "trace": "One step traced, kernel by kernel: {model}, batch {batch}"}


@pytest.mark.parametrize("model", ["opt-13b", "tiny-llama", "llama2-13b"])
def test_a_model_not_recorded_titles_each_figure_by_what_it_shows(tab, model):
    """Each figure's note says what it would show of the model: the same title as where the
    model is recorded (all three said "Decode throughput")."""
    tab.controls["model"].value = model
    want = {name: title.format(model=model, batch=64) for name, title in WHAT_EACH_SHOWS.items()}
    assert titles(tab) == want
    for pane in tab.figures.values():
        assert "not recorded on the H200" in pane.figure.layout.title.text
    tab.controls["model"].value = "llama3-8b"
    assert titles(tab) == {name: title.format(model="llama3-8b", batch=64)
                           for name, title in WHAT_EACH_SHOWS.items()}


def test_an_unreadable_recording_titles_each_figure_by_what_it_shows(tab):
    tab.recorded, tab.unreadable["recorded"] = {"rows": []}, "h200/e2e.json: truncated"
    tab.controls["batch"].value = 1
    assert titles(tab) == {name: title.format(model="llama3-8b", batch=1)
                           for name, title in WHAT_EACH_SHOWS.items()}
    assert all("unreadable recording" in a.text for pane in tab.figures.values()
               for a in pane.figure.layout.annotations)


def test_every_legend_is_below_its_x_axis_at_the_tabs_heights(tab):
    """The legend hangs from each figure's bottom edge, where Plotly's automargin holds the x
    axis's labels and title above it: at 360 px, 0.22 of the plot's height below it (35 px) was
    on the axis title "decode step", and where the legend wraps the plot shrinks and it moves up
    again (kvlab.viz.layout)."""
    for name, pane in tab.figures.items():
        fig = pane.figure
        assert fig.layout.height == FIGURE_HEIGHTS[name]
        if name not in ("tensor_parallel", "trace"):  # notes here: nothing recorded on
            assert len(fig.data) > 1  # several GPUs, no step traced on the H200 at batch 64
        legend = fig.layout.legend
        assert (legend.yref, legend.y, legend.yanchor) == ("container", 0.0, "bottom")
        assert fig.layout.margin.b is None


def test_tensor_parallel_says_how_to_record_it_until_it_is(tab):
    figure = tab.figures["tensor_parallel"].figure
    assert "not recorded" in figure.layout.title.text
    assert any("torchrun --nproc-per-node N" in a.text for a in figure.layout.annotations)
    assert "GPUs:" not in tab.status.value


def test_recorded_tensor_parallel_runs_are_drawn_beside_one_gpu(monkeypatch, tmp_path):
    """A run of 2 GPUs, made here from the one-GPU recording (every step 0.6x as long), in a
    results folder of its own."""
    shutil.copytree(results_dir() / "h200", tmp_path / "h200")
    one = load_result("h200", "e2e")
    two = {**one, "tp": 2, "date": "2027-01-02T00:00:00+00:00",
           "rows": [{**r, "tp": 2, "step_ms": r["step_ms"] * 0.6,
                     "tokens_per_s": r["tokens_per_s"] / 0.6}
                    for r in one["rows"] if r["variant"] != "hf-static"]}
    (tmp_path / "h200x2").mkdir()
    (tmp_path / "h200x2" / "e2e.json").write_text(json.dumps(two))
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab()  # llama3-8b, batch 64
    figure = tab.figures["tensor_parallel"].figure
    at_64 = {r["variant"]: r for r in one["rows"] if r["model"] == "llama3-8b"
             and r["batch"] == 64}
    gqa = next(t for t in figure.data if t.name == "gqa")
    assert list(gqa.x) == [1, 2]
    assert list(gqa.y) == pytest.approx([at_64["gqa"]["tokens_per_s"],
                                         at_64["gqa"]["tokens_per_s"] / 0.6])
    assert "hf-static" not in {t.name for t in figure.data}
    assert "2 GPUs recorded on 2 x NVIDIA H200, 2027-01-02" in figure.layout.title.text
    assert (figure.layout.legend.yref, figure.layout.legend.y) == ("container", 0.0)
    ratio = at_64["gqa"]["step_ms"] / at_64["gqa+prefetch"]["step_ms"]
    assert ("The paper's prefetch on 2 GPUs: vllm_v1+prefetch" in tab.status.value
            and f"gqa+prefetch {ratio:.2f}x gqa's speed" in tab.status.value)
    tab.controls["model"].value = "qwen2.5-7b"  # recorded on one GPU only
    assert "not recorded" in tab.figures["tensor_parallel"].figure.layout.title.text
    assert "GPUs:" not in tab.status.value


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


def recorded_row(model, variant, batch):
    """(the H200's row, the copy roofline its run measured, GB/s)."""
    for name in ("e2e", "e2e_qwen7b", "e2e_qwen14b"):
        result = load_result("h200", name)
        for r in result["rows"]:
            if (r["model"], r["variant"], r["batch"]) == (model, variant, batch):
                return r, result["roofline_copy_gbps"]
    raise LookupError((model, variant, batch))


def modelled_ms(row, run_gbps, gpu):
    """The step the tab should show for `gpu`: the bytes the H200's step read over the GPU's
    copy roofline, times the H200's ratio of step to roofline step."""
    step_bytes = row["roofline_ms"] * 1e-3 * run_gbps * 1e9
    return step_bytes / (gpus.copy_roofline_gbps(gpu)[0] * 1e9) * 1e3 * row["ratio_to_roofline"]


def says_measured_or_recorded(text: str) -> list[str]:
    """Where `text` says "measured" or "recorded" but of the H200's (its measured ratio of step
    to roofline step, the measured shares of its spec that kvlab.gpus' assumptions start from)."""
    return re.findall(r"\b(?:measured|recorded)\b", html.unescape(text).replace(
        "H200's measured", ""))


def test_another_gpu_models_each_step_from_its_roofline_step(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    gpu = "a100-40gb-pcie"
    tab = EndToEndTab(gpu=gpu)  # llama3-8b, batch 64
    throughput = tab.figures["throughput"].figure
    lines = {t.name: t for t in throughput.data}
    gqa, run_gbps = recorded_row("llama3-8b", "gqa", 64)
    want = modelled_ms(gqa, run_gbps, gpu)
    assert want > 1.5 * gqa["step_ms"]  # the A100's 1,555 GB/s against the H200's 4,800
    at_64 = list(lines["gqa"].x).index(64)
    assert lines["gqa"].y[at_64] == pytest.approx(64 / want * 1e3)
    roofline = lines["roofline (weights + KV at the copy roofline)"]
    assert roofline.y[list(roofline.x).index(64)] == pytest.approx(
        64 / (want / gqa["ratio_to_roofline"]) * 1e3)
    steps = {t.name: list(t.y) for t in tab.figures["steps"].figure.data}
    assert steps["gqa"] == pytest.approx([ms * want / gqa["step_ms"]
                                          for ms in gqa["step_ms_runs"]])
    step_bytes = gqa["roofline_ms"] * run_gbps * 1e6
    status = html.unescape(tab.status.value)
    assert (f"{step_bytes / 1e9:,.2f} GB a step / {gpus.copy_roofline_gbps(gpu)[0]:,.0f} GB/s = "
            f"{want / gqa['ratio_to_roofline']:.2f} ms, x {gqa['ratio_to_roofline']:.2f} = "
            f"{want:.2f} ms (gqa)") in status
    assert "NVIDIA H200's measured ratio to its own at batch 64" in status
    assert gpus.copy_roofline_gbps(gpu)[1] in status  # the assumption, as kvlab.gpus states it
    # the paper's bulk prefetch needs sm_90: not on the A100, on the H100
    assert "gqa+prefetch" not in lines and "gqa+prefetch left out" in status
    assert "needs sm_90 or later" in status
    tab.controls["gpu"].value = "h100-sxm"
    assert "gqa+prefetch" in {t.name for t in tab.figures["throughput"].figure.data}


@pytest.mark.parametrize("gpu", ["a100-40gb-pcie", "h100-sxm", "rtx4090", "b200"])
def test_another_gpu_is_modelled_for_it_never_measured_or_recorded(tab, gpu):
    name = gpus.GPUS[gpu].name
    for model, batch in (("llama3-8b", 128), ("qwen2.5-14b", 1), ("opt-13b", 16)):
        tab.controls["gpu"].value = gpus.REFERENCE
        tab.controls["model"].value, tab.controls["batch"].value = model, batch
        tab.controls["gpu"].value = gpu
        for key, pane in tab.figures.items():
            title = pane.figure.layout.title.text
            if key == "trace" and gpu in module.TRACED:  # the traces it recorded
                if model != "opt-13b":  # (opt-13b: no run on the H200, every figure says so)
                    assert f"recorded on {name}" in title
                    continue
            assert f"modelled for {name}" in title
            assert not re.search(r"measured|recorded", title), title
        assert tab.figures["tensor_parallel"].figure.data == ()
        assert "Serving" not in tab.status.value
        modelled = "<br>".join(line for line in tab.status.value.split("<br>") if not (
            gpu in module.TRACED and line.startswith(("Traced step", "L2 hits"))))
        assert says_measured_or_recorded(modelled) == []
    tab.controls["model"].value = "llama3-8b"
    tab.controls["gpu"].value = gpus.REFERENCE  # the recordings, labelled so, again
    assert "recorded on NVIDIA H200" in tab.figures["throughput"].figure.layout.title.text
    assert "Serving" in tab.status.value


def test_a_model_past_the_gpus_memory_is_a_status_message(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(batch=128, gpu="rtx4090")  # 24 GB
    gqa, run_gbps = recorded_row("llama3-8b", "gqa", 128)
    per_token = MODELS["llama3-8b"].kv_bytes_per_token() * 128
    weights = gqa["roofline_ms"] * run_gbps * 1e6 - per_token * (512 + 256 / 2)
    need = weights + per_token * 768
    assert 15e9 < weights < 16.1e9 and need > 24e9
    first = html.unescape(tab.status.value).split("<br>")[0]
    assert first == (f"llama3-8b at batch 128 needs at least {need / 1e9:,.1f} GB (the "
                     f"{weights / 1e9:,.1f} GB of weights a step reads, "
                     f"{per_token * 768 / 1e9:,.1f} GB of K, V for 128 x 768 tokens): past the "
                     "NVIDIA GeForce RTX 4090's 24 GB")
    assert tab.figures["steps"].figure.data == ()
    note = tab.figures["steps"].figure.layout.annotations[0].text
    assert html.unescape(note.replace("<br>", " ")) == first
    gqa_line = next(t for t in tab.figures["throughput"].figure.data if t.name == "gqa")
    assert list(gqa_line.x) == [1, 16, 64]  # 128 left out
    tab.controls["batch"].value = 64  # 6.4 GB of K, V: it fits
    assert "needs at least" in tab.status.value and "fastest gqa" in tab.status.value
    tab.controls["model"].value = "qwen2.5-14b"  # 28 GB of weights: no batch fits
    assert tab.status.value.startswith("qwen2.5-14b at batch 64 needs at least")
    assert all(pane.figure.data == () for pane in tab.figures.values())


def test_an_unknown_gpu_is_refused(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(ValueError, match="gpu='a100': must be one of"):
        EndToEndTab(gpu="a100")


def test_on_a_gpu_the_run_generated_here_shows_under_its_gpu_alone(monkeypatch):
    """This machine's GPU an A100 40GB PCIe: a run generated here shows beside the steps modelled
    for it, and not under the H200's recordings; Generate is disabled there."""
    here = gpus.GPUS["a100-40gb-pcie"]
    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
    monkeypatch.setattr(kvlab.panels.widgets, "local_gpu", lambda: here)
    tab = EndToEndTab()
    assert tab.controls["gpu"].value == tab.local_gpu == here.key
    tab.generated = ("llama3-8b", 64, types.SimpleNamespace(
        attention="gqa", step_ms=[9.0, 8.0, 8.0], decode_tokens_per_s=8000.0, tokens=[[1, 2]]))
    tab.refresh()
    steps = tab.figures["steps"].figure
    assert steps.data[0].name == "kvlab.LLM (gqa), now" and list(steps.data[0].y) == [9, 8, 8]
    title = steps.layout.title.text
    assert "measured on FAKE GPU; the rest modelled for NVIDIA A100-PCIE-40GB" in title
    assert not tab.generate_button.disabled
    tab.controls["gpu"].value = gpus.REFERENCE
    assert tab.generate_button.disabled
    assert "FAKE GPU" not in tab.figures["steps"].figure.layout.title.text
    assert "kvlab.LLM" not in {t.name for t in tab.figures["steps"].figure.data}


def test_the_step_anatomy_shows_where_hbm_idles_beside_the_recorded_step(tab):
    from kvlab.predict.step import fit_step_model, step_anatomy

    figure = tab.figures["anatomy"].figure
    busy, idle, per_sequence, recorded = figure.data
    assert busy.name.startswith("HBM busy") and idle.name.startswith("HBM idle")
    gqa = next(r for r in load_result("h200", "e2e")["rows"]
               if (r["model"], r["variant"], r["batch"]) == ("llama3-8b", "gqa", 64))
    assert recorded.name == f"recorded step {gqa['step_ms']:.2f} ms"
    fit = fit_step_model()
    anatomy = step_anatomy("llama3-8b", 64, 512 + 128, load_result(
        "h200", "e2e")["roofline_copy_gbps"], fit)
    assert list(idle.x) == [k["idle_us"] / 1e3 for k in anatomy["kernels"]] + [
        anatomy["idle_us"] / 1e3]
    assert list(busy.y)[-1] == "whole step" and list(busy.y)[3] == "attention x32"
    assert "fitted on the NVIDIA H200's steps" in figure.layout.title.text
    assert "Idle budget (modelled)" in tab.status.value


def test_the_cross_kernel_prefetch_hides_idle_time_in_the_anatomy(tab):
    """The check box draws the prefetch's modelled bound: the idle each covered GEMM would
    lose, hatched past the step, the step itself that much shorter, and says it is a bound;
    beside it the step as learned from the prefetch's recordings, a line and a status line."""
    from kvlab.predict.ahead import ahead_effect, fit_ahead
    from kvlab.predict.step import ahead_size, fit_step_model

    gbps, fit = load_result("h200", "e2e")["roofline_copy_gbps"], fit_step_model()
    before = tab.figures["anatomy"].figure.data
    tab.controls["ahead"].value = True
    busy, idle, per_sequence, hidden, recorded, learned = tab.figures["anatomy"].figure.data
    row = next(r for r in tab.recorded["rows"] if r["model"] == "llama3-8b"
               and r["batch"] == 64 and r["variant"] == "gqa")
    effect = ahead_effect("llama3-8b", 64, row["prompt"] + row["new_tokens"] / 2, ahead_size(
        fit, gbps, 64), gbps, fit, fit_ahead("h200", step=fit))
    without = per_sequence.x[-1] + busy.x[-1] + idle.x[-1] + hidden.x[-1]  # ms
    step_ms = without + effect["delta_us"] / 1e3
    assert learned.name == f"with the prefetch, learned {step_ms:.2f} ms"
    assert effect["delta_us"] > 0  # at batch 64 the recordings say it costs more than it hides
    status = html.unescape(tab.status.value)
    assert ("Learned from the recordings (h200/e2e_ahead_4k, h200/e2e_ahead_32k, "
            "h200/e2e_ahead_kv_32k, h200/e2e_ahead_kv_b2, "
            "h100/steptrace_counters, h100/steptrace_4k_counters)") in status
    assert f"{effect['delta_us'] / 1e3:+.2f} ms a step" in status
    assert hidden.name.startswith("idle the cross-kernel prefetch would hide")
    assert hidden.marker.pattern.shape == "/"
    names = list(hidden.y)
    assert hidden.x[names.index("w_o x32")] == 0  # batch 64: the attention kernel before W_O
    assert hidden.x[names.index("qkv x32")] > 0 and hidden.x[-1] == pytest.approx(
        sum(hidden.x[:-1]))
    assert idle.x[-1] + hidden.x[-1] == pytest.approx(before[1].x[-1])  # what it takes off
    assert f"ahead_bytes={ahead_size(fit, gbps, 64):,}" in html.unescape(tab.status.value)
    assert "a modelled bound, not measured" in tab.status.value
    tab.controls["ahead"].value = False
    assert len(tab.figures["anatomy"].figure.data) == len(before)


def test_the_anatomy_says_why_where_the_learned_prefetch_cannot_be_fitted(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setattr(module, "fit_ahead",
                        lambda gpu, step: (_ for _ in ()).throw(ValueError("no counters")))
    tab = EndToEndTab(batch=1)
    tab.controls["ahead"].value = True
    assert "the learned prefetch cannot be fitted: no counters" in html.unescape(
        tab.status.value)
    assert len(tab.figures["anatomy"].figure.data) == 5  # the bound, no learned line


def test_the_prefetch_box_lists_the_steps_recorded_with_it_off_and_on(tab):
    from kvlab.predict.ahead import lever_pairs

    tab.controls["batch"].value = 16
    tab.controls["ahead"].value = True
    status = html.unescape(tab.status.value)
    for machine, name in (("h100", "e2e_ahead"), ("h200", "e2e_ahead_4k")):
        base, lever = next((b, a) for b, a in lever_pairs(load_result(machine, name))
                           if (b["model"], b["batch"]) == ("llama3-8b", 16))
        assert (f"({machine}/{name}, recorded on" in status and
                f"gqa+ahead at {base['step_ms'] / lever['step_ms']:.3f}x gqa's speed" in status)
    assert "(h200/e2e_ahead_32k, recorded on" not in status  # batch 1, the Qwen models only
    assert "greedy tokens the same" in status and "not the same" not in status
    tab.controls["ahead"].value = False
    assert "off and on in one loop" not in tab.status.value


def test_at_batch_1_the_prefetch_box_adds_the_kv_blocks_learned_and_measured(tab):
    """Up to 2 sequences (layer_ops' linears) the K/V blocks' prefetch is learned (the H200's,
    sized as bench e2e sizes it) and its recorded steps are listed; above, neither."""
    from kvlab.predict.ahead import KV_LEVER, fit_kv_ahead, lever_pairs

    tab.controls["batch"].value = 1
    tab.controls["ahead"].value = True
    status = html.unescape(tab.status.value)
    assert ("K/V blocks' prefetch (kvlab.LLM(ahead_kv_bytes=3,145,728)), each layer's QKV linear "
            "bringing its K/V into L2 for the attention, learned from the recordings "
            "(h200/e2e_ahead_kv_32k, h200/e2e_ahead_kv_b2)") in status  # 768 tokens of 4 KiB
    assert f"{fit_kv_ahead('h200').net_cost:.0%} of the prefetched bytes' time" in status
    for machine, name in (("h100", "e2e_ahead_kv"), ("h100", "e2e_ahead_kv_4k")):
        base, on = next((b, a) for b, a in lever_pairs(load_result(machine, name),
                                                       lever=KV_LEVER)
                        if (b["model"], b["batch"]) == ("llama3-8b", 1))
        assert (f"Measured with the K/V blocks' prefetch off and on in one loop ({machine}/"
                f"{name}, recorded on" in status and f"gqa+ahead_kv at "
                f"{base['step_ms'] / on['step_ms']:.3f}x gqa's speed" in status)
    tab.controls["batch"].value = 16
    assert "K/V blocks' prefetch" not in tab.status.value


def test_an_unreadable_recording_of_the_prefetch_is_named(monkeypatch, tab):
    def unreadable(machine, name, keys=None):
        raise ValueError(f"{machine}/{name}.json: not a JSON recording")

    monkeypatch.setattr(module, "load_result", unreadable)
    tab.controls["ahead"].value = True
    assert ("Unreadable recording of the cross-kernel prefetch: h100/e2e_ahead.json: not a JSON "
            "recording") in html.unescape(tab.status.value)


def test_a_gpu_without_recordings_of_the_prefetch_takes_the_h200s_learned_model(tab):
    tab.controls["ahead"].value = True
    tab.controls["gpu"].value = "h20"
    status = html.unescape(tab.status.value)
    assert "the NVIDIA H200's model assumed for the NVIDIA H20" in status
    tab.controls["gpu"].value = "h100-sxm"
    assert ("Learned from the recordings (h100/e2e_ahead, h100/e2e_ahead_4k, "
            "h100/e2e_ahead_32k, h100/e2e_ahead_kv, h100/e2e_ahead_kv_4k, "
            "h100/steptrace_counters, h100/steptrace_4k_counters)") in (
        html.unescape(tab.status.value))
    assert tab.ahead_model("h20") is tab.ahead_model("h200")  # fitted once


def test_the_step_anatomy_says_why_where_it_cannot_model(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setattr(module, "fit_step_model",
                        lambda: (_ for _ in ()).throw(ValueError("no steps to fit on")))
    tab = EndToEndTab()
    title = tab.figures["anatomy"].figure.layout.title.text
    assert "not modelled" in title
    assert "the step model cannot be fitted: no steps to fit on" in html.unescape(
        tab.status.value)


def test_each_lever_is_set_against_its_kernel_without_it():
    rows = [{"variant": v, "step_ms": ms} for v, ms in (
        ("gqa", 5.0), ("gqa+prefetch", 5.5), ("gqa+ahead", 4.0), ("vllm_v1+prefetch", 6.0))]
    assert module._prefetch_gains(rows) == ["gqa+prefetch 0.91x gqa's speed"]
    assert module._prefetch_gains(rows, "+ahead") == ["gqa+ahead 1.25x gqa's speed"]


def test_the_traced_step_is_drawn_kernel_by_kernel_with_its_gaps(monkeypatch):
    """The H100's trace of one step at the tab's model and batch: every kernel in a lane of its
    group, the gaps between them marked, and what lies beyond the roofline said."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(gpu="h100-sxm")
    row = next(r for r in load_result("h100", "steptrace")["rows"]
               if (r["model"], r["batch"], r["ahead_bytes"]) == ("llama3-8b", 64, 0))
    figure = tab.figures["trace"].figure
    assert "recorded on NVIDIA H100 80GB HBM3" in figure.layout.title.text
    assert "prompts of 512 tokens" in figure.layout.title.text
    lanes = [d for d in figure.data if d.type == "bar"]
    *groups, gaps = lanes
    assert sum(len(d.x) for d in groups) == len(row["kernels"])
    assert sum(gaps.x) == pytest.approx(row["gap_us"] / 1e3, rel=0.05)
    assert groups[0].name.startswith("GEMMs: ")
    legend = figure.layout.legend
    assert (legend.yref, legend.y, legend.yanchor) == ("container", 0.0, "bottom")
    status = html.unescape(tab.status.value)
    assert (f"Traced step (NVIDIA H100 80GB HBM3, prompts of 512 tokens): "
            f"{row['span_us'] / 1e3:.2f} ms") in status


def test_the_gemms_l2_hits_are_set_beside_the_prefetch_the_model_gives(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(model="qwen2.5-7b", batch=1, gpu="h100-sxm")
    rows = [r for r in load_result("h100", "steptrace_counters")["rows"] if r["batch"] == 1]
    without, ahead = (next(r["counters"]["gemms"][0] for r in rows if bool(r["ahead_bytes"]) is a)
                      for a in (False, True))
    status = html.unescape(tab.status.value)
    assert (f"without -> with the cross-kernel prefetch of 10 MiB: qkv "
            f"{without['load_hit_share']:.0%} -> {ahead['load_hit_share']:.0%} "
            f"(modelled +{ahead['prefetched_share']:.0%})") in status


def test_the_attentions_l2_hits_are_set_beside_the_kv_share_prefetched(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(model="llama3-8b", batch=1, gpu="h100-sxm")
    rows = load_result("h100", "steptrace_kv_counters")["rows"]
    without, on = (next(r for r in rows if bool(r["ahead_kv_bytes"]) is a) for a in (False, True))
    status = html.unescape(tab.status.value)
    assert (f"4,064 tokens), without -> with the K/V blocks' prefetch of 16 MiB: "
            f"{without['counters']['attention']['load_hit_share']:.0%} -> "
            f"{on['counters']['attention']['load_hit_share']:.0%} (it covers 100% of a layer's "
            "K and V)") in status
    assert "K/V blocks' prefetch" not in html.unescape(
        EndToEndTab(model="llama3-8b", batch=16, gpu="h100-sxm").status.value)


def test_counter_lines_pair_rows_of_one_recording_and_one_lever(monkeypatch):
    """A row with the K/V blocks' prefetch is no GEMM baseline, and rows of two recordings (or
    two prompts) are not paired: the weights' line pairs 'a' without with 'a' with, not with the
    K/V row or 'b''s row before it; the attention's line pairs 'a''s K/V row."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(model="llama3-8b", batch=1, gpu="h100-sxm")

    def row(source, ahead, ahead_kv, qkv, attention, prompt=512):
        return {"model": "llama3-8b", "batch": 1, "prompt": prompt, "source": source,
                "ahead_bytes": ahead, "ahead_kv_bytes": ahead_kv, "counters": {
                    "gemms": [{"name": "qkv", "load_hit_share": qkv, "prefetched_share": 0.3}],
                    "attention": {"load_hit_share": attention, "prefetched_share": 1.0}}}

    rows = [row("a", 0, 2**24, 0.80, 0.40), row("b", 0, 0, 0.90, 0.5),
            row("a", 0, 0, 0.01, 0.02), row("a", 2**20, 0, 0.20, 0.5),
            row("a", 0, 0, 0.70, 0.5, prompt=4096)]
    counters = {"rows": rows, "source_dates": {"a": "2026-12-06", "b": "2026-12-06"}}
    monkeypatch.setitem(tab._traces, "h100-sxm", ({"rows": []}, {}, counters))
    monkeypatch.setattr(module, "label", lambda result, rows: "L")
    lines = tab._counter_lines("llama3-8b", 1, "h100-sxm")
    assert lines == [
        "L2 hits of the attention's loads (ncu, L, 512 tokens), without -> with the K/V blocks' "
        "prefetch of 16 MiB: 2% -> 40% (it covers 100% of a layer's K and V)",
        "L2 hits of the GEMMs' loads (ncu, L, 512 tokens), without -> with the cross-kernel "
        "prefetch of 1 MiB: qkv 1% -> 20% (modelled +30%)"]


def test_a_step_not_traced_says_how_to_record_it(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setattr(module, "STEP_TRACES", ("not_recorded",))
    tab = EndToEndTab(gpu="h100-sxm")
    assert "not traced" in tab.figures["trace"].figure.layout.title.text
    note = tab.figures["trace"].figure.layout.annotations[0].text
    assert "python -m kvlab bench steptrace --models llama3-8b --batches 64" in note
    assert "Traced step" not in tab.status.value


def test_the_h200_draws_its_own_traced_step_without_the_h100s_counters(monkeypatch):
    """At batch 16 the H200's trace at 4,064 tokens (it has none at 512): its kernels, its
    file's copy roofline under the groups' modelled bytes, and no L2 hits (ncu's counters are
    the H100's only); the H100's view of the same point draws the H100's."""
    from kvlab.bench.steptrace import mean_context
    from kvlab.predict.step import fit_step_model, step_anatomy
    from kvlab.viz.e2e import trace_groups

    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(model="llama3-8b", batch=16)
    assert tab.controls["gpu"].value == gpus.REFERENCE
    result = load_result("h200", "steptrace_4k")
    row = next(r for r in result["rows"]
               if (r["model"], r["batch"], r["ahead_bytes"]) == ("llama3-8b", 16, 0))
    figure = tab.figures["trace"].figure
    assert "recorded on NVIDIA H200," in figure.layout.title.text
    assert "prompts of 4,064 tokens" in figure.layout.title.text
    *groups, gaps = [d for d in figure.data if d.type == "bar"]
    assert sum(len(d.x) for d in groups) == len(row["kernels"]) == 388
    assert sum(gaps.x) == pytest.approx(row["gap_us"] / 1e3, rel=0.05)
    anatomy = step_anatomy("llama3-8b", 16, mean_context(
        row["prompt"], row["new_tokens"], len(row["steps"])), result["roofline_copy_gbps"],
        fit_step_model())
    gemms = trace_groups(row["kernels"], anatomy)[0]
    assert groups[0].name == (f"GEMMs: {gemms['busy_us'] / 1e3:.2f} ms busy, its bytes "
                              f"{gemms['roofline_us'] / 1e3:.2f} ms at the copy roofline")
    status = html.unescape(tab.status.value)
    assert (f"Traced step (NVIDIA H200, prompts of 4,064 tokens): {row['span_us'] / 1e3:.2f} ms"
            f", {row['span_us'] / row['roofline_us']:.2f}x its bytes at the copy roofline") in (
        status)
    assert "Traced step (NVIDIA H100" not in status and "L2 hits" not in status
    tab.controls["gpu"].value = "h100-sxm"
    h100 = next(r for r in load_result("h100", "steptrace")["rows"]
                if (r["model"], r["batch"], r["ahead_bytes"]) == ("llama3-8b", 16, 0))
    figure = tab.figures["trace"].figure
    assert "recorded on NVIDIA H100 80GB HBM3" in figure.layout.title.text
    assert "prompts of 512 tokens" in figure.layout.title.text
    *groups, gaps = [d for d in figure.data if d.type == "bar"]
    assert sum(len(d.x) for d in groups) == len(h100["kernels"])
    assert "Traced step (NVIDIA H100 80GB HBM3, prompts of 4,064 tokens)" in html.unescape(
        tab.status.value)
    assert set(tab._traces) == {"h100-sxm", gpus.REFERENCE}  # each GPU's, loaded once


def test_the_h200_lists_each_prompt_length_it_traced(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = EndToEndTab(model="qwen2.5-7b", batch=1)
    rows = {r["prompt"]: r for name in ("steptrace_4k", "steptrace_32k")
            for r in load_result("h200", name)["rows"]
            if (r["model"], r["batch"]) == ("qwen2.5-7b", 1)}
    assert sorted(rows) == [4064, 32736]
    status = html.unescape(tab.status.value)
    for prompt, row in rows.items():
        assert (f"Traced step (NVIDIA H200, prompts of {prompt:,} tokens): "
                f"{row['span_us'] / 1e3:.2f} ms") in status
    assert "prompts of 4,064 tokens" in tab.figures["trace"].figure.layout.title.text
    assert "L2 hits" not in status  # the H100's counters at this point are not the H200's


def test_the_h200_at_a_batch_it_did_not_trace_says_how_to_record_it(tab):
    assert tab.controls["batch"].value == 64
    assert not any(r["batch"] == 64 for name in ("steptrace_4k", "steptrace_32k")
                   for r in load_result("h200", name)["rows"])
    figure = tab.figures["trace"].figure
    assert "not traced, not modelled" in figure.layout.title.text
    note = figure.layout.annotations[0].text
    assert "python -m kvlab bench steptrace --models llama3-8b --batches 64" in note
    assert "benchmarks/results/&lt;gpu&gt;/steptrace.json" in note
    assert "Traced step" not in tab.status.value


def test_a_gpu_without_traces_names_the_gpus_with_them(tab):
    tab.controls["batch"].value = 16  # traced on both
    tab.controls["gpu"].value = "a100-80gb-sxm4"
    figure = tab.figures["trace"].figure
    assert "modelled for NVIDIA A100-SXM4-80GB" in figure.layout.title.text
    note = html.unescape(figure.layout.annotations[0].text.replace("<br>", " "))
    assert ("A step traced kernel by kernel is recorded on the NVIDIA H100 80GB HBM3 and the "
            "NVIDIA H200 only: choose one in the GPU control") in note
    assert "python -m kvlab bench steptrace --models llama3-8b --batches 16" in note
    assert "Traced step" not in tab.status.value and "L2 hits" not in tab.status.value


def test_an_unreadable_trace_is_named_in_its_figure(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    for machine in ("h100", "h200"):
        shutil.copytree(results_dir() / machine, tmp_path / machine)
    (tmp_path / "h100" / "steptrace.json").write_text("{")
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)
    tab = EndToEndTab(gpu="h100-sxm")
    figure = tab.figures["trace"].figure
    assert "unreadable recording" in figure.layout.annotations[0].text
    assert "steptrace.json" in tab.unreadable["traced (h100)"]
