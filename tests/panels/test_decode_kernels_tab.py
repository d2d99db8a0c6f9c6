"""The "Decode kernels" tab on the sim backend: a recorded point shows its recording, any other
point, model, head layout or GPU kvlab.predict's answer, labelled so."""

import html

import ipywidgets as widgets
import pytest
from factories import check_imports_leave_out

import kvlab.panels.widgets
from kvlab.panels import dashboard
from kvlab.panels.decode_kernels import RECORDED, DecodeKernelsTab
from kvlab.results import load_results, nearest_rows


@pytest.fixture
def tab(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return DecodeKernelsTab()


def descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)


def expected_rows(model, batch, context, block_size=16):
    rows = nearest_rows(load_results(*RECORDED), model, batch, context)
    return [r for r in rows if r["block_size"] in (block_size, None)]


def test_dashboard_has_the_tab_after_paged_cache(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dash = dashboard()
    assert list(dash.controls)[1] == "decode_kernels"
    assert dash.tab_widget.titles[1] == "Decode kernels"
    assert set(dash.figures["decode_kernels"]) == {"bandwidth", "speedup", "timeline"}


def test_sim_shows_recorded_rows_and_no_run_button(tab):
    assert tab.run_button is None and tab.progress is None
    assert not any(isinstance(w, widgets.Button) for w in descendants(tab.widget))
    rows = expected_rows("llama3-8b", 16, 8192)
    assert list(tab.figures["bandwidth"].figure.data[0].x) == [r["gbps"] for r in rows]
    assert "recorded on NVIDIA H200" in tab.figures["bandwidth"].figure.layout.title.text
    assert "recorded on NVIDIA H200" in tab.figures["speedup"].figure.layout.title.text
    assert "recorded on" in tab.status.value
    assert [tab.controls[n].value for n in ("qo_heads", "kv_heads", "head_dim")] == [32, 8, 128]
    assert tab.controls["gpu"].value == "h200"


def test_a_change_sends_the_points_charts_before_the_traced_step(tab):
    sent = []
    for name, pane in tab.figures.items():
        pane.observe(lambda change, name=name: sent.append(name), names="outputs")
    tab.controls["batch"].value = 24  # (the speedup chart's nearest recording stays: not sent)
    assert sent[0] == "bandwidth" and sent[-1] == "timeline" and len(sent) == len(set(sent))


def modelled_bars(figure):
    """The bars' labels, and whether each is hatched (modelled)."""
    bars = figure.data[0]
    return dict(zip(bars.y, (shape == "/" for shape in bars.marker.pattern.shape), strict=True))


def test_a_point_not_recorded_is_modelled_at_the_point_asked(tab):
    from kvlab.predict import decode_launch

    c = tab.controls
    c["model"].value = "qwen2.5-7b"
    c["batch"].value = 100
    c["context"].value = 6000
    figure = tab.figures["bandwidth"].figure
    bars = figure.data[0]
    assert set(modelled_bars(figure).values()) == {True}
    assert list(bars.y) == ["vllm_v1 / none", "vllm_v1 / line K+V d=1", "gqa / none",
                            "gqa / line K+V d=1"]
    answer = decode_launch("qwen2.5-7b", 100, 6000, family="gqa", prefetch="line K+V d=1",
                           recordings=False)
    assert bars.x[3] == pytest.approx(answer.gbps)
    lo, hi = (answer.gbps * answer.time_ms / ms for ms in answer.error_band[::-1])
    assert bars.error_x.array[3] == pytest.approx(hi - answer.gbps)
    assert bars.error_x.arrayminus[3] == pytest.approx(answer.gbps - lo)
    assert "qwen2.5-7b batch=100 context=6000" in figure.layout.title.text
    assert "modelled: closed form (kvlab.predict)" in figure.layout.title.text
    status = tab.status.value
    assert "the nearest recorded point: batch=128 context=8192" in status
    assert "whiskers: 90% of held-out launches" in status
    assert "run on a GPU" not in status and "python -m kvlab bench attention --models " \
        "qwen2.5-7b --batches 100 --contexts 6000" in status
    assert [c[n].value for n in ("qo_heads", "kv_heads", "head_dim")] == [28, 4, 128]
    speedup = tab.figures["speedup"].figure
    assert "qwen2.5-7b, block_size=16" in speedup.layout.title.text
    assert "recorded" in speedup.layout.title.text  # the model is recorded at block 16


def test_every_block_size_the_kernels_take_is_offered_and_answers(tab):
    c = tab.controls
    assert list(c["block_size"].options) == [8, 16, 32, 64, 128, 256]
    c["block_size"].value = 32  # recorded at 16 x 8192
    c["distance"].value = 3
    assert "vllm_v1 / line K+V d=3 not recorded: modelled (hatched)" in tab.status.value
    hatched = modelled_bars(tab.figures["bandwidth"].figure)
    assert hatched.pop("vllm_v1 / line K+V d=3") and not any(hatched.values())
    assert "block_size=32" in tab.figures["bandwidth"].figure.layout.title.text
    for size in (8, 64, 256):
        c["block_size"].value = size
        figure = tab.figures["bandwidth"].figure
        assert figure.data and f"block_size={size}" in figure.layout.title.text


def test_vllm_v1_at_a_block_size_it_lacks_is_named_and_gqa_shown(tab):
    tab.controls["block_size"].value = 128
    assert "vllm_v1 takes block sizes 8, 16, 32: not shown" in tab.status.value
    assert not any(y.startswith("vllm_v1") for y in tab.figures["bandwidth"].figure.data[0].y)
    speedup = tab.figures["speedup"].figure
    assert speedup.data == () and "vllm_v1 takes block sizes 8, 16, 32" in (
        speedup.layout.annotations[0].text)
    tab.controls["kernel"].value = "gqa"
    assert tab.figures["speedup"].figure.data


@pytest.mark.parametrize("model", ["tiny-llama", "opt-13b", "llama2-13b"])
def test_a_model_not_recorded_is_modelled_with_the_command_that_records_it(tab, model):
    tab.controls["model"].value = model
    for name in ("bandwidth", "speedup"):
        figure = tab.figures[name].figure
        assert figure.data and "modelled: closed form" in figure.layout.title.text
        assert model in figure.layout.title.text
    assert f"python -m kvlab bench attention --models {model}" in tab.status.value
    timeline = tab.figures["timeline"].figure
    assert timeline.data == () and f"{model}: not recorded" in timeline.layout.annotations[0].text
    assert f"python -m kvlab bench timeline --models {model}" in (
        timeline.layout.annotations[0].text)
    tab.controls["model"].value = "llama3-8b"  # back to recorded
    assert "recorded on" in tab.figures["bandwidth"].figure.layout.title.text


def test_a_custom_head_layout_is_modelled_and_names_its_heads(tab):
    c = tab.controls
    c["kv_heads"].value = 4  # 32:4 is no preset
    assert c["model"].value == "custom"
    title = tab.figures["bandwidth"].figure.layout.title.text
    assert "custom 32:4, head_dim 128 batch=16 context=8192" in title
    assert "modelled" in title and tab.figures["speedup"].figure.data
    assert "not traced" in tab.figures["timeline"].figure.layout.title.text
    c["head_dim"].value = 64
    assert "custom 32:4, head_dim 64" in tab.status.value
    c["model"].value = "qwen2.5-7b"  # a preset sets its heads
    assert [c[n].value for n in ("qo_heads", "kv_heads", "head_dim")] == [28, 4, 128]
    assert "recorded on" in tab.figures["bandwidth"].figure.layout.title.text


@pytest.mark.parametrize(("controls", "why"), [
    ({"qo_heads": 72}, "num_qo_heads=72, num_kv_heads=8: the kernels take 1 to 8 query heads"),
    ({"kv_heads": 5}, "num_qo_heads=32: must be divisible by num_kv_heads=5"),
    ({"batch": 1024, "context": 131072}, "batch=1024, context=131072: K and V of one layer"),
    ({"gpu": "a100-40gb-pcie", "kv_dtype": "fp8"}, "dtype='fp8': gqa widens e4m3"),
    ({"gpu": "a100-80gb-sxm4", "prefetch": "bulk"}, "cp.async.bulk.prefetch.L2 needs sm_90"),
])
def test_a_setting_no_kernel_takes_is_named_in_the_status_and_every_figure(tab, controls, why):
    for name, value in controls.items():
        tab.controls[name].value = value
    status = html.unescape(tab.status.value)
    assert "no kernel takes this setting" in status and why in status
    for pane in tab.figures.values():
        assert pane.figure.data == ()
        assert "no kernel takes this setting" in pane.figure.layout.annotations[0].text


@pytest.mark.parametrize("gpu", ["h20", "a100-40gb-pcie", "b200", "rtx4090"])
@pytest.mark.parametrize("view", [{}, {"kv_dtype": "fp8"}, {"lengths": "lognormal:3200,16384"}])
def test_another_gpu_is_modelled_for_it_never_measured_or_recorded(tab, gpu, view):
    from kvlab.gpus import GPUS, copy_roofline_gbps

    if gpu == "a100-40gb-pcie" and view.get("kv_dtype") == "fp8":
        view = {}  # no fp8 before sm_89: refused (above)
    for name, value in {"gpu": gpu, **view}.items():
        tab.controls[name].value = value
    for name in ("bandwidth", "speedup"):
        title = tab.figures[name].figure.layout.title.text
        assert f"modelled for {GPUS[gpu].name}" in title
        assert "recorded" not in title and "measured" not in title
    bars = tab.figures["bandwidth"].figure
    (line,) = [d.name for d in bars.data if d.name and d.name.startswith("copy roofline")]
    assert float(line.split()[2]) == pytest.approx(copy_roofline_gbps(gpu)[0], abs=1)
    assert f"{GPUS[gpu].name}: copy roofline assumed" in html.unescape(tab.status.value)
    timeline = tab.figures["timeline"].figure.layout.title.text
    assert "recorded on NVIDIA H200" in timeline and "not modelled for" in timeline


def test_blocks_in_order_of_a_model_not_recorded_name_the_command(tab):
    """Blocks in order are not modelled: a model not recorded names the command, a custom
    layout or another GPU says it is neither recorded nor modelled."""
    from kvlab.results import label

    tab.controls["blocks"].value = "in order"
    tab.controls["model"].value = "opt-13b"
    recording = label(load_results("h200", ("attention_block_order",)))
    for pane in tab.figures.values():
        figure = pane.figure
        assert figure.data == () and "opt-13b: not recorded" in figure.layout.annotations[0].text
    assert tab.figures["speedup"].figure.layout.title.text == (
        f"Blocks in order: opt-13b<br><sub>not {recording}</sub>")
    assert "--models opt-13b --batches 16 --contexts 8192 --in-order" in tab.status.value
    tab.controls["gpu"].value = "h20"
    assert "not modelled" in tab.status.value
    assert "not measured, not modelled" in tab.figures["bandwidth"].figure.layout.title.text


def test_kernel_choice_selects_speedup_and_outline(tab):
    tab.controls["kernel"].value = "gqa"
    tab.controls["prefetch"].value = "bulk"
    bars = tab.figures["bandwidth"].figure.data[0]
    outlined = [x for x, w in zip(bars.y, bars.marker.line.width, strict=True) if w > 0]
    assert outlined == ["gqa / bulk K+V d=1"]
    assert "over none: gqa<br><sub>llama3-8b," in tab.figures["speedup"].figure.layout.title.text
    assert "not recorded" not in tab.status.value


def test_the_tab_builds_without_importing_torch():
    check_imports_leave_out(
        "from kvlab.panels.decode_kernels import DecodeKernelsTab\nDecodeKernelsTab()",
        ("torch", "cupy"),
    )


def fake_gpu(monkeypatch, module):
    """The tab's cuda path without a GPU: an H200 in use, its label FAKE GPU."""
    from kvlab.gpus import GPUS

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(kvlab.panels.widgets, "local_gpu", lambda: GPUS["h200"])
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")


def test_run_button_wiring_with_a_fake_measurement(monkeypatch):
    """The cuda path without a GPU: `measure_point` replaced by a fake built from recorded rows."""
    import kvlab.panels.decode_kernels as module

    recorded = load_results(*RECORDED)
    calls = []

    def fake_measure(model, batch, context, block_size, distance, on_progress=None, fp8=False,
                     lengths="equal", in_order=False):
        calls.append((model, batch, context, block_size, distance, fp8, lengths, in_order))
        rows = [{**r, "gbps": r["gbps"] + 1} for r in expected_rows(model, batch, context)]
        on_progress(1, 1)
        return {**recorded, "rows": rows}

    fake_gpu(monkeypatch, module)
    monkeypatch.setattr(module, "measure_point", fake_measure)
    tab = module.DecodeKernelsTab(batch=64, context=1024)
    assert "press Run" in tab.status.value
    assert "recorded on" in tab.figures["bandwidth"].figure.layout.title.text
    tab.run_button.click()
    assert calls == [("llama3-8b", 64, 1024, 16, 1, False, "equal", False)]
    assert tab.progress.value == 1
    rows = expected_rows("llama3-8b", 64, 1024)
    assert list(tab.figures["bandwidth"].figure.data[0].x) == [r["gbps"] + 1 for r in rows]
    assert "measured on FAKE GPU" in tab.figures["bandwidth"].figure.layout.title.text
    assert "measured on FAKE GPU" in tab.status.value


def test_fp8_shows_gqa_on_fp8_beside_fp16_and_its_speedup(tab):
    from kvlab.panels.decode_kernels import RECORDED_FP8

    recorded = load_results(*RECORDED_FP8)
    tab.controls["prefetch"].value = "none"
    tab.controls["batch"].value, tab.controls["context"].value = 64, 32768
    tab.controls["kv_dtype"].value = "fp8"
    bars = tab.figures["bandwidth"].figure.data[0]
    shown = ("gqa", "gqa_fp8", "flashinfer", "flashinfer_tc", "flashinfer_fp8",
             "flashinfer_tc_fp8")  # FlashInfer in gqa's loop, on both caches
    assert list(bars.y) == [f"{k} / none" for k in shown] + ["sdpa"]
    rows = {r["kernel"]: r for r in nearest_rows(recorded, "llama3-8b", 64, 32768)}
    assert list(bars.x) == [rows[k]["gbps"] for k in (*shown, "sdpa")]
    assert "an fp8 cache is read by gqa only, not vllm_v1: gqa shown" in tab.status.value
    assert "recorded on NVIDIA H200" in tab.figures["bandwidth"].figure.layout.title.text
    tab.controls["prefetch"].value = "bulk"  # recorded without prefetch only: modelled beside
    assert "gqa_fp8 / bulk K+V d=1 not recorded: modelled (hatched)" in tab.status.value
    assert modelled_bars(tab.figures["bandwidth"].figure) == {
        **{f"{k} / none": False for k in shown}, "sdpa": False, "gqa_fp8 / bulk K+V d=1": True}
    speed = tab.figures["speedup"].figure
    assert "fp8 KV cache: gqa's tokens/s over fp16's" in speed.layout.title.text
    by_point = dict(zip(speed.data[0].x, speed.data[0].y, strict=True))
    assert by_point["64 x 32768"] == pytest.approx(rows["gqa"]["ms"] / rows["gqa_fp8"]["ms"])
    assert len(by_point) == 9  # batch 1/16/64 x context 1k/4k/32k
    tab.controls["batch"].value = 20  # not recorded: modelled, fp8 and fp16
    assert set(modelled_bars(tab.figures["bandwidth"].figure).values()) == {True}
    assert "the nearest recorded point: batch=16 context=32768" in tab.status.value
    tab.controls["kv_dtype"].value = "float16"
    assert "L2 prefetch speedup" in tab.figures["speedup"].figure.layout.title.text


@pytest.mark.parametrize(("control", "value", "flag", "title"), [
    ("kv_dtype", "fp8", "--fp8", "fp8 KV cache"),
    ("blocks", "in order", "--in-order", "Blocks in order"),
])
def test_a_view_for_a_model_not_recorded_names_the_command(tab, control, value, flag, title):
    tab.controls[control].value = value
    tab.controls["model"].value = "opt-6.7b"
    assert flag in tab.status.value and "not recorded" in tab.status.value
    assert title in tab.figures["speedup"].figure.layout.title.text


def test_blocks_in_order_show_both_orders_and_their_ratios(tab):
    from kvlab.panels.decode_kernels import RECORDED_BLOCK_ORDER

    recorded = load_results(*RECORDED_BLOCK_ORDER)
    tab.controls["kernel"].value = "gqa"
    tab.controls["batch"].value, tab.controls["context"].value = 60, 8192
    tab.controls["blocks"].value = "in order"
    rows = {r["kernel"]: r for r in nearest_rows(recorded, "llama3-8b", 64, 8192)}
    bars = tab.figures["bandwidth"].figure.data[0]
    kernels = ("vllm_v1", "vllm_v1_in_order", "gqa", "gqa_in_order", "sdpa")
    assert list(bars.y) == [*(f"{k} / none" for k in kernels[:4]), "sdpa"]
    assert list(bars.x) == [rows[k]["gbps"] for k in kernels]
    assert list(bars.marker.line.width) == [0, 0, 0, 3, 0]  # gqa in order, the kernel chosen
    status = tab.status.value
    assert "batch=64 context=8192" in status and "requested batch=60" in status
    assert "blocks in order recorded at block_size 16 and without prefetch only" in status
    ratios = tab.figures["speedup"].figure
    assert "Blocks in order" in ratios.layout.title.text
    gqa = next(d for d in ratios.data if d.name == "gqa: in order / scattered")
    by_point = dict(zip(gqa.x, gqa.y, strict=True))
    assert by_point["64 x 8192"] == pytest.approx(rows["gqa"]["ms"] / rows["gqa_in_order"]["ms"])
    assert len(by_point) == 16  # batch 1/16/64/128 x context 1k/4k/8k/32k
    tab.controls["kv_dtype"].value = "fp8"  # fp8 is recorded on scattered blocks only
    assert "fp8: blocks scattered through the pool only" in tab.status.value
    tab.controls["kv_dtype"].value = "float16"
    tab.controls["blocks"].value = "scattered"
    assert "L2 prefetch speedup" in tab.figures["speedup"].figure.layout.title.text


def mixed_rows(model, lengths, batch):
    from kvlab.panels.decode_kernels import RECORDED_MIXED

    return [r for r in load_results(*RECORDED_MIXED)["rows"]
            if (r["model"], r["lengths"], r["batch"]) == (model, lengths, batch)]


def test_mixed_lengths_show_a_recorded_batch_and_model_the_others(tab):
    tab.controls["batch"].value = 64
    tab.controls["lengths"].value = "lognormal:1536,2048"
    rows = mixed_rows("llama3-8b", "lognormal:1536,2048", 64)
    bars = tab.figures["bandwidth"].figure.data[0]
    assert list(bars.y) == ["vllm_v1 / none", "gqa / none", "gqa_split_longest / none",
                            "flashinfer / none", "flashinfer_tc / none", "read"]
    assert list(bars.x) == [r["gbps"] for r in rows]
    assert "batch=64 of lognormal:1536,2048" in tab.status.value
    assert "recorded on" in tab.status.value and "mean 1536" in tab.status.value
    tab.controls["batch"].value = 50
    assert "batch=50 not recorded for these lengths" in tab.status.value
    assert set(modelled_bars(tab.figures["bandwidth"].figure).values()) == {True}
    tab.controls["batch"].value = 64
    assert tab.controls["context"].disabled
    by_batch = tab.figures["speedup"].figure
    assert "Mixed lengths: % of the copy roofline by batch" in by_batch.layout.title.text
    gqa = next(d for d in by_batch.data if d.name == "gqa")
    assert list(gqa.x)[1] == f"64 x ~{rows[0]['context']} (max {rows[0]['max_context']})"
    assert list(gqa.y) == [next(r["pct_roofline"] for r in mixed_rows(
        "llama3-8b", "lognormal:1536,2048", b) if r["kernel"] == "gqa") for b in (16, 64, 256)]
    tab.controls["lengths"].value = "equal"
    assert "L2 prefetch speedup" in tab.figures["speedup"].figure.layout.title.text
    assert not tab.controls["context"].disabled


def test_mixed_lengths_for_a_model_not_recorded_are_modelled_and_name_the_command(tab):
    tab.controls["model"].value = "opt-6.7b"
    tab.controls["lengths"].value = "lognormal:3200,32768"
    assert "--lengths lognormal:3200,32768 --kernels vllm_v1 gqa read --prefetch none" in (
        tab.status.value)
    assert set(modelled_bars(tab.figures["bandwidth"].figure).values()) == {True}
    by_batch = tab.figures["speedup"].figure
    assert "modelled" in by_batch.layout.title.text
    assert [x.split(" x")[0] for x in by_batch.data[0].x] == ["16", "64", "256"]


def test_run_button_measures_mixed_lengths_with_a_fake_measurement(monkeypatch):
    import kvlab.panels.decode_kernels as module

    calls = []

    def fake_measure(model, batch, context, block_size, distance, on_progress=None, fp8=False,
                     lengths="equal", in_order=False):
        calls.append((model, batch, lengths))
        return {"roofline_copy_gbps": 4000.0,
                "rows": [{**r, "gbps": 1.0} for r in mixed_rows(model, lengths, 16)]}

    fake_gpu(monkeypatch, module)
    monkeypatch.setattr(module, "measure_point", fake_measure)
    tab = module.DecodeKernelsTab(batch=16, lengths="lognormal:3200,16384")
    assert "press Run to measure these lengths" in tab.status.value
    tab.run_button.click()
    assert calls == [("llama3-8b", 16, "lognormal:3200,16384")]
    assert list(tab.figures["bandwidth"].figure.data[0].x) == [1.0] * len(
        mixed_rows("llama3-8b", "lognormal:3200,16384", 16))
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text


@pytest.mark.gpu
def test_run_button_measures_mixed_lengths_on_this_gpu(monkeypatch):
    """(FlashInfer's tensor-core path beside them where it is installed; its CUDA-core decode
    where it takes the batch)"""
    from kvlab.kernels import flashinfer_peer

    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = DecodeKernelsTab(model="qwen2.5-7b", batch=8, kernel="gqa",
                           lengths="lognormal:1536,2048")
    tab.run_button.click()
    bars = tab.figures["bandwidth"].figure.data[0]
    peers = {y for y in bars.y if y.startswith("flashinfer")}
    assert set(bars.y) - peers == {"vllm_v1 / none", "gqa / none", "gqa_split_longest / none",
                                   "read"}
    assert peers <= {"flashinfer / none", "flashinfer_tc / none"}
    assert ("flashinfer_tc / none" in peers) == flashinfer_peer.available()
    assert all(gbps > 0 for gbps in bars.x)
    assert "measured on" in tab.figures["speedup"].figure.layout.title.text


def test_run_button_measures_both_block_orders_with_a_fake_measurement(monkeypatch):
    import kvlab.panels.decode_kernels as module

    recorded = load_results(*module.RECORDED_BLOCK_ORDER)
    calls = []

    def fake_measure(model, batch, context, block_size, distance, on_progress=None, fp8=False,
                     lengths="equal", in_order=False):
        calls.append((model, batch, context, in_order))
        rows = [{**r, "gbps": 1.0} for r in recorded["rows"] if r["model"] == model]
        return {**recorded, "rows": rows}

    fake_gpu(monkeypatch, module)
    monkeypatch.setattr(module, "measure_point", fake_measure)
    tab = module.DecodeKernelsTab(batch=16, context=4096, blocks="in order")
    assert "press Run to measure this point on this GPU, both orders" in tab.status.value
    tab.run_button.click()
    assert calls == [("llama3-8b", 16, 4096, True)]
    tab.controls["kv_dtype"].value = "fp8"  # the fp8 view reads scattered blocks only
    tab.run_button.click()
    assert calls[-1] == ("llama3-8b", 16, 4096, False)
    tab.controls["kv_dtype"].value = "float16"
    assert set(tab.figures["bandwidth"].figure.data[0].x) == {1.0}
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text


@pytest.mark.gpu
@pytest.mark.parametrize(("view", "kernels"), [
    ({"kv_dtype": "fp8"}, {"gqa / none", "gqa_fp8 / none", "sdpa", "read"}),
    ({"blocks": "in order"}, {"vllm_v1 / none", "vllm_v1_in_order / none", "gqa / none",
                              "gqa_in_order / none", "sdpa", "read"}),
])
def test_run_button_measures_a_view_on_this_gpu(monkeypatch, view, kernels):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = DecodeKernelsTab(model="llama3-8b", batch=4, context=2048, kernel="gqa", **view)
    tab.run_button.click()
    bars = tab.figures["bandwidth"].figure.data[0]
    assert kernels <= set(bars.y)
    assert all(gbps > 0 for gbps in bars.x)
    assert "measured on" in tab.figures["speedup"].figure.layout.title.text


@pytest.mark.gpu
def test_run_button_measures_the_point_on_this_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = DecodeKernelsTab(model="llama3-8b", batch=2, context=1024, distance=2)
    tab.run_button.click()
    assert tab.progress.value == tab.progress.max == 1
    assert "measured on" in tab.figures["bandwidth"].figure.layout.title.text
    bars = tab.figures["bandwidth"].figure.data[0]
    assert {"sdpa", "read", "gqa / none", "vllm_v1 / bulk K+V d=2"} <= set(bars.y)
    assert all(gbps > 0 for gbps in bars.x)


def timeline_row(result, model, batch, context):
    return next(r for r in result["rows"]
                if (r["model"], r["batch"], r["context"]) == (model, batch, context))


def test_the_timeline_shows_the_nearest_traced_step(tab):
    recorded = load_results("h200", ("timeline",))
    tab.controls["batch"].value, tab.controls["context"].value = 1, 30000
    fig = tab.figures["timeline"].figure
    title = fig.layout.title.text
    assert "llama3-8b batch=1 context=32768" in title and "recorded on NVIDIA H200" in title
    assert "asked for batch=1 context=30000: nearest traced point shown" in title
    row = timeline_row(recorded, "llama3-8b", 1, 32768)
    main = next(d for d in fig.data if d.name == "decode: main loop")
    starts = [x for x in main.x[0::3]]
    assert starts == [t / 1000 for t in row["trace"]["decode"]["landed"]]
    assert any(d.name.startswith("merge:") for d in fig.data)  # a split step
    tab.controls["batch"].value, tab.controls["context"].value = 16, 1024
    fig = tab.figures["timeline"].figure
    assert "nearest" not in fig.layout.title.text
    assert not any(d.name.startswith("merge:") for d in fig.data)


def test_the_timeline_says_what_it_traced_in_other_views(tab):
    tab.controls["kv_dtype"].value = "fp8"
    title = tab.figures["timeline"].figure.layout.title.text
    assert "fp16, block 16, blocks scattered over the pool" in title
    assert "traced at the cache settings above, not this view's" in title


def test_a_model_without_a_traced_step_shows_the_command(tab):
    tab.controls["model"].value = "opt-6.7b"
    note = tab.figures["timeline"].figure.layout.annotations[0].text
    assert "opt-6.7b: not recorded;<br>run on a GPU:" in note
    assert "python -m kvlab bench timeline --models opt-6.7b --points 16x8192" in note


def test_the_timeline_of_mixed_lengths_is_the_traced_batch_of_those_lengths(tab):
    tab.controls["lengths"].value = "lognormal:3200,16384"
    tab.controls["batch"].value = 50
    title = tab.figures["timeline"].figure.layout.title.text
    row = next(r for r in load_results("h200", ("timeline_mixed",))["rows"]
               if r["model"] == "llama3-8b" and r["batch"] == 64
               and r["lengths"] == "lognormal:3200,16384")
    assert (f"batch=64 of lognormal:3200,16384: mean {row['context']}, longest "
            f"{row['max_context']}") in title
    assert "asked for batch=50: nearest traced batch shown" in title
    tab.controls["model"].value = "opt-6.7b"
    note = tab.figures["timeline"].figure.layout.annotations[0].text.replace("<br>", " ")
    assert ("python -m kvlab bench timeline --models opt-6.7b --lengths lognormal:3200,16384 "
            "--batches 50") in note


def test_trace_button_wiring_with_a_fake_trace(monkeypatch):
    import kvlab.panels.decode_kernels as module

    recorded = load_results("h200", ("timeline",))
    calls = []

    def fake_trace(model, batch, context):
        calls.append((model, batch, context))
        return timeline_row(recorded, "llama3-8b", 16, 1024)

    fake_gpu(monkeypatch, module)
    monkeypatch.setattr(module, "trace_point", fake_trace)
    tab = module.DecodeKernelsTab(batch=16, context=1024)
    assert "press Trace CTAs" in tab.figures["timeline"].figure.layout.title.text
    tab.trace_button.click()
    assert calls == [("llama3-8b", 16, 1024)]
    title = tab.figures["timeline"].figure.layout.title.text
    assert "measured on FAKE GPU" in title and "press Trace CTAs" not in title


def test_trace_button_traces_the_mixed_lengths_of_the_view(monkeypatch):
    import kvlab.panels.decode_kernels as module

    row = timeline_row(load_results("h200", ("timeline",)), "llama3-8b", 16, 1024)
    calls = []

    def fake_trace(model, batch, shape):
        calls.append((model, batch, shape))
        return {**row, "lengths": shape, "max_context": 7000}

    fake_gpu(monkeypatch, module)
    monkeypatch.setattr(module, "trace_point", fake_trace)
    tab = module.DecodeKernelsTab(batch=16, lengths="lognormal:3200,16384")
    tab.trace_button.click()
    assert calls == [("llama3-8b", 16, "lognormal:3200,16384")]
    title = tab.figures["timeline"].figure.layout.title.text
    assert "batch=16 of lognormal:3200,16384: mean 1024, longest 7000" in title
    assert "measured on FAKE GPU" in title


@pytest.mark.gpu
def test_trace_button_traces_the_point_on_this_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = DecodeKernelsTab(model="llama3-8b", batch=1, context=4096)
    tab.trace_button.click()
    fig = tab.figures["timeline"].figure
    assert "measured on" in fig.layout.title.text
    assert "llama3-8b batch=1 context=4096" in fig.layout.title.text
    assert any(d.name.startswith("merge:") for d in fig.data)


@pytest.mark.parametrize("installed", [False, True])
@pytest.mark.parametrize("lengths", ["equal", "production:32768"])
def test_the_run_button_times_flashinfer_beside_the_others_where_it_is_installed(
        monkeypatch, installed, lengths):
    from kvlab.bench import attention
    from kvlab.kernels import flashinfer_peer
    from kvlab.panels import decode_kernels

    asked = {}
    monkeypatch.setattr(attention, "measure_point",
                        lambda *args, **options: asked.update(options) or {"rows": []})
    monkeypatch.setattr(flashinfer_peer, "available", lambda: installed)
    decode_kernels.measure_point("llama3-8b", 16, 1024, 16, 1, lengths=lengths)
    peers = {"flashinfer", "flashinfer_tc"} & set(asked["kernels"])
    assert peers == ({"flashinfer", "flashinfer_tc"} if installed else set())
    assert {"gqa", "vllm_v1", "read"} <= set(asked["kernels"])


def test_the_h100_shows_flashinfer_recorded_beside_the_others(tab):
    from kvlab.panels.decode_kernels import RECORDED_FLASHINFER

    for name, value in {"gpu": "h100-sxm", "model": "llama3-8b", "batch": 16, "context": 1024,
                        "kernel": "gqa", "prefetch": "none"}.items():
        tab.controls[name].value = value
    figure = tab.figures["bandwidth"].figure
    assert "recorded on NVIDIA H100 80GB HBM3" in figure.layout.title.text
    recorded = [r for r in nearest_rows(load_results(*RECORDED_FLASHINFER), "llama3-8b", 16, 1024)
                if r["block_size"] in (16, None) and not r["kernel"].endswith("_fp8")]
    assert {"flashinfer / none", "flashinfer_tc / none", "gqa / none"} <= set(figure.data[0].y)
    assert list(figure.data[0].x) == [r["gbps"] for r in recorded]  # as recorded, none modelled
    assert "FlashInfer is recorded" not in tab.status.value


def test_the_h200_view_says_where_flashinfer_is_recorded(tab):
    tab.controls["batch"].value, tab.controls["context"].value = 16, 1024
    assert not any(y.startswith("flashinfer") for y in tab.figures["bandwidth"].figure.data[0].y)
    assert ("FlashInfer is recorded on the NVIDIA H100 80GB HBM3 only: choose gpu h100-sxm"
            in html.unescape(tab.status.value))


def test_the_flashinfer_note_and_bars_hold_to_the_recorded_point_and_dtype(tab):
    tab.controls["batch"].value, tab.controls["context"].value = 16, 2048  # not on the H100 grid
    assert "FlashInfer is recorded" not in tab.status.value
    for name, value in {"gpu": "h100-sxm", "batch": 16, "context": 1024}.items():
        tab.controls[name].value = value
    assert not any(y.endswith("_fp8 / none") for y in tab.figures["bandwidth"].figure.data[0].y)
