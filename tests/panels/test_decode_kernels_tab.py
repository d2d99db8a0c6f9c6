"""The "Decode kernels" tab on the sim backend: the figures show the recorded nearest point."""

import ipywidgets as widgets
import pytest
from factories import check_imports_leave_out

from kvlab.panels import dashboard
from kvlab.panels.decode_kernels import RECORDED, DecodeKernelsTab
from kvlab.results import load_results, nearest_rows
from kvlab.viz.kernels import variant


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
    assert tab.controls["gqa_ratio"].value.startswith("32:8") and tab.controls["gqa_ratio"].disabled


def test_controls_move_to_the_nearest_recorded_point(tab):
    c = tab.controls
    c["model"].value = "qwen2.5-7b"
    c["batch"].value = 100
    c["context"].value = 6000  # log2-nearest recorded: 8192, not 4096
    rows = expected_rows("qwen2.5-7b", 128, 8192)
    bars = tab.figures["bandwidth"].figure.data[0]
    assert list(bars.x) == [r["gbps"] for r in rows]
    assert list(bars.y) == [variant(r) for r in rows]
    assert "batch=128 context=8192" in tab.status.value
    assert "requested batch=100 context=6000" in tab.status.value
    assert c["gqa_ratio"].value.startswith("28:4")
    speedup_title = tab.figures["speedup"].figure.layout.title.text
    assert "over none: vllm_v1<br><sub>qwen2.5-7b," in speedup_title


def test_sim_offers_only_recorded_block_sizes_and_reports_unrecorded_prefetch(tab):
    c = tab.controls
    assert list(c["block_size"].options) == [16, 32, 128]
    c["block_size"].value = 32
    c["distance"].value = 3
    assert "vllm_v1 / line K+V d=3 not recorded" in tab.status.value
    assert "not available without a GPU" in tab.status.value
    rows = expected_rows("llama3-8b", 16, 8192, block_size=32)
    assert list(tab.figures["bandwidth"].figure.data[0].x) == [r["gbps"] for r in rows]
    assert "block_size=32" in tab.figures["bandwidth"].figure.layout.title.text
    assert "nearest recorded shown" not in tab.figures["bandwidth"].figure.layout.title.text


def test_a_point_not_recorded_is_named_in_the_subtitle(tab):
    tab.controls["batch"].value = 100
    title = tab.figures["bandwidth"].figure.layout.title.text
    assert "asked for batch=100 context=8192 block_size=16: nearest recorded shown" in title
    assert "batch=128 context=8192" in title


def test_vllm_v1_at_a_block_size_it_lacks_shows_a_note_not_a_stale_chart(tab):
    tab.controls["block_size"].value = 128  # recorded for gqa only: vllm_v1 supports 8-32
    speedup = tab.figures["speedup"].figure
    assert speedup.data == () and "no rows" in speedup.layout.annotations[0].text


def test_unrecorded_model_shows_the_command_that_records_it(tab):
    tab.controls["model"].value = "tiny-llama"
    for pane in tab.figures.values():
        figure = pane.figure
        assert figure.data == ()
        (note,) = figure.layout.annotations
        assert "tiny-llama: not recorded" in note.text
        bench = "timeline" if pane is tab.figures["timeline"] else "attention"
        assert f"python -m kvlab bench {bench} --models tiny-llama" in note.text
        assert "not recorded on NVIDIA H200" in figure.layout.title.text
    tab.controls["model"].value = "llama3-8b"  # back to recorded: the notes are gone
    assert tab.figures["bandwidth"].figure.layout.annotations == ()


# view -> its controls, the recording it reads, the speedup figure's title for a model it lacks
VIEWS = {
    "attention": ({}, RECORDED, "L2 prefetch speedup: {model}, vllm_v1"),
    "fp8": ({"kv_dtype": "fp8"}, ("h200", ("attention_fp8",)),
            "fp8 KV cache, gqa over fp16: {model}"),
    "block_order": ({"blocks": "in order"}, ("h200", ("attention_block_order",)),
                    "Blocks in order: {model}"),
    "mixed": ({"lengths": "lognormal:3200,16384"}, ("h200", ("attention_mixed",)),
              "Mixed lengths: {model}"),
}


@pytest.mark.parametrize("model", ["opt-13b", "tiny-llama", "llama2-13b"])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_model_not_recorded_titles_each_figure_by_the_model_and_its_recording(tab, model,
                                                                                  view):
    """Each figure says what it would show of this model, and that the recording its view
    reads (not another view's) lacks it; the titles named neither the model nor that."""
    from kvlab.results import label

    controls, recording, speed = VIEWS[view]
    for name, value in {**controls, "model": model}.items():
        tab.controls[name].value = value
    titles = {name: pane.figure.layout.title.text for name, pane in tab.figures.items()}
    assert titles["bandwidth"].startswith(f"Decode attention GB/s: {model}<br>")
    assert titles["speedup"].startswith(f"{speed.format(model=model)}<br>")
    assert titles["timeline"].startswith(f"A decode step, CTA by CTA: {model}<br>")
    provenance = f"<sub>not {label(load_results(*recording))}</sub>"
    assert titles["bandwidth"].endswith(provenance) and titles["speedup"].endswith(provenance)
    for pane in tab.figures.values():
        assert pane.figure.data == () and f"{model}: not recorded" in (
            pane.figure.layout.annotations[0].text)


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

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
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
    tab.controls["batch"].value, tab.controls["context"].value = 64, 32768
    tab.controls["kv_dtype"].value = "fp8"
    bars = tab.figures["bandwidth"].figure.data[0]
    assert list(bars.y) == ["gqa / none", "gqa_fp8 / none", "sdpa"]
    rows = {r["kernel"]: r for r in nearest_rows(recorded, "llama3-8b", 64, 32768)}
    assert list(bars.x) == [rows[k]["gbps"] for k in ("gqa", "gqa_fp8", "sdpa")]
    assert "an fp8 cache is read by gqa only, not vllm_v1: gqa shown" in tab.status.value
    assert "fp8 recorded at block_size 16 and prefetch none only" in tab.status.value
    speed = tab.figures["speedup"].figure
    assert "fp8 KV cache: gqa's tokens/s over fp16's" in speed.layout.title.text
    by_point = dict(zip(speed.data[0].x, speed.data[0].y, strict=True))
    assert by_point["64 x 32768"] == pytest.approx(rows["gqa"]["ms"] / rows["gqa_fp8"]["ms"])
    assert len(by_point) == 9  # batch 1/16/64 x context 1k/4k/32k
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


def test_mixed_lengths_show_the_kernels_at_the_nearest_recorded_batch(tab):
    tab.controls["batch"].value = 50
    tab.controls["lengths"].value = "lognormal:1536,2048"
    rows = mixed_rows("llama3-8b", "lognormal:1536,2048", 64)
    bars = tab.figures["bandwidth"].figure.data[0]
    assert list(bars.y) == ["vllm_v1 / none", "gqa / none", "gqa_split_longest / none", "read"]
    assert list(bars.x) == [r["gbps"] for r in rows]
    status = tab.status.value
    assert "batch=64 of lognormal:1536,2048" in status and "requested batch=50" in status
    assert "batch=50 not recorded for these lengths" in status and "mean 1536" in status
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


def test_mixed_lengths_for_a_model_not_recorded_name_the_command(tab):
    tab.controls["model"].value = "opt-6.7b"
    tab.controls["lengths"].value = "lognormal:3200,32768"
    assert "--lengths lognormal:3200,32768 --kernels vllm_v1 gqa read --prefetch none" in (
        tab.status.value)


def test_run_button_measures_mixed_lengths_with_a_fake_measurement(monkeypatch):
    import kvlab.panels.decode_kernels as module

    calls = []

    def fake_measure(model, batch, context, block_size, distance, on_progress=None, fp8=False,
                     lengths="equal", in_order=False):
        calls.append((model, batch, lengths))
        return {"roofline_copy_gbps": 4000.0,
                "rows": [{**r, "gbps": 1.0} for r in mixed_rows(model, lengths, 16)]}

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
    monkeypatch.setattr(module, "measure_point", fake_measure)
    tab = module.DecodeKernelsTab(batch=16, lengths="lognormal:3200,16384")
    assert "press Run to measure these lengths" in tab.status.value
    tab.run_button.click()
    assert calls == [("llama3-8b", 16, "lognormal:3200,16384")]
    assert list(tab.figures["bandwidth"].figure.data[0].x) == [1.0] * 4
    assert "measured on FAKE GPU" in tab.figures["speedup"].figure.layout.title.text


@pytest.mark.gpu
def test_run_button_measures_mixed_lengths_on_this_gpu(monkeypatch):
    monkeypatch.delenv("KVLAB_BACKEND", raising=False)
    tab = DecodeKernelsTab(model="qwen2.5-7b", batch=8, kernel="gqa",
                           lengths="lognormal:1536,2048")
    tab.run_button.click()
    bars = tab.figures["bandwidth"].figure.data[0]
    assert set(bars.y) == {"vllm_v1 / none", "gqa / none", "gqa_split_longest / none", "read"}
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

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
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
    note = tab.figures["timeline"].figure.layout.annotations[0].text
    assert ("python -m kvlab bench timeline --models opt-6.7b --lengths lognormal:3200,16384 "
            "--batches 50") in note


def test_trace_button_wiring_with_a_fake_trace(monkeypatch):
    import kvlab.panels.decode_kernels as module

    recorded = load_results("h200", ("timeline",))
    calls = []

    def fake_trace(model, batch, context):
        calls.append((model, batch, context))
        return timeline_row(recorded, "llama3-8b", 16, 1024)

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
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

    monkeypatch.setattr(module, "backend", lambda: "cuda")
    monkeypatch.setattr(module, "device_label", lambda: "measured on FAKE GPU")
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
