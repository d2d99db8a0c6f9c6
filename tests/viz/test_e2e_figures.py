"""kvlab.viz.e2e: throughput against batch per variant with HF and the roofline; step times;
rows of the reference GPU modelled for another."""

import pytest

from kvlab import gpus
from kvlab.config import MODELS
from kvlab.viz.e2e import (
    TITLES,
    kernel_name,
    modelled_rows,
    steps_figure,
    tensor_parallel_figure,
    throughput_figure,
    trace_figure,
    trace_groups,
)


def row(variant, batch, ms, roofline_ms=2.0):
    return {"model": "m", "variant": variant, "batch": batch, "step_ms": ms,
            "tokens_per_s": batch / ms * 1e3, "ratio_to_roofline": ms / roofline_ms,
            "roofline_ms": roofline_ms, "prompt": 512, "new_tokens": 256}


def test_throughput_has_a_line_per_variant_and_the_roofline():
    rows = [row("gqa", 16, 5.0), row("gqa", 1, 4.0), row("hf-static", 1, 8.0),
            row("hf-static", 16, 10.0), {**row("gqa", 1, 1.0), "model": "other"}]
    fig = throughput_figure(rows, "m", "recorded on X, 2026-12-01")
    gqa, hf, roofline = fig.data
    assert list(gqa.x) == [1, 16] and list(gqa.y) == [250.0, 3200.0]
    assert hf.line.dash == "dash" and list(roofline.y) == [500.0, 8000.0]
    assert "recorded on X" in fig.layout.title.text and fig.layout.xaxis.type == "log"
    with pytest.raises(ValueError, match="model='n': no rows \\(recorded: m, other\\)"):
        throughput_figure(rows, "n", "x")


def test_tensor_parallel_has_a_line_per_kvlab_variant_against_the_gpus():
    rows = [row("gqa", 64, 6.0), {**row("gqa", 64, 4.0), "tp": 2}, {**row("gqa", 64, 3.0), "tp": 4},
            row("hf-static", 64, 20.0), {**row("gqa+prefetch", 64, 4.2), "tp": 2},
            {**row("gqa", 16, 3.0), "tp": 2}]
    fig = tensor_parallel_figure(rows, "m", 64, "recorded on X")
    gqa, prefetch = fig.data
    assert gqa.name == "gqa" and list(gqa.x) == [1, 2, 4]
    assert list(gqa.y) == [64 / 6.0 * 1e3, 64 / 4.0 * 1e3, 64 / 3.0 * 1e3]
    assert prefetch.name == "gqa+prefetch" and list(prefetch.x) == [2]
    assert list(fig.layout.xaxis.tickvals) == [1, 2, 4] and "batch 64" in fig.layout.title.text
    with pytest.raises(ValueError, match="model='m', batch=1: no kvlab rows"):
        tensor_parallel_figure(rows, "m", 1, "x")


def test_steps_has_a_line_per_run():
    fig = steps_figure({"gqa": [3.0, 2.0], "hf-static": [5.0]}, "Steps", "measured on Y")
    assert [list(t.y) for t in fig.data] == [[3.0, 2.0], [5.0]] and list(fig.data[0].x) == [1, 2]


@pytest.mark.parametrize("height", [360, 420])
def test_each_legend_hangs_below_the_x_axis_at_any_height(height):
    """At the bottom edge of the figure, where Plotly's automargin keeps it below the x axis's
    labels and title (kvlab.viz.layout); not a fraction of the plot's height below the plot."""
    rows = [row("gqa", 1, 4.0), row("gqa", 16, 5.0), row("hf-static", 1, 8.0),
            {**row("gqa", 16, 3.0), "tp": 2}]
    figures = [throughput_figure(rows, "m", "p", height=height),
               tensor_parallel_figure(rows, "m", 16, "p", height=height),
               steps_figure({"gqa": [3.0, 2.0], "hf-static": [5.0]}, "Steps", "p", "d",
                            height=height)]
    for fig in figures:
        legend = fig.layout.legend
        assert (legend.yref, legend.y, legend.yanchor) == ("container", 0.0, "bottom")
        assert fig.layout.height == height and fig.layout.margin.b is None


def test_titles_are_the_tabs_titles():
    rows = [row("gqa", 1, 4.0), {**row("gqa", 1, 3.0), "tp": 2}]
    assert throughput_figure(rows, "m", "p").layout.title.text.startswith(
        TITLES["throughput"].format(model="m") + "<br>")
    assert tensor_parallel_figure(rows, "m", 1, "p").layout.title.text.startswith(
        TITLES["tensor_parallel"].format(model="m", batch=1) + "<br>")


def recorded(batch, roofline_ms, ratio):
    """A llama3-8b row of a run named "run" (prompt 512, 256 new tokens)."""
    ms = roofline_ms * ratio
    return {**row("gqa", batch, ms, roofline_ms), "model": "llama3-8b", "source": "run",
            "step_ms_runs": [2 * ms, ms, ms]}


def test_modelled_rows_read_the_same_bytes_at_the_gpus_roofline_times_the_ratio():
    rows = [recorded(1, 4.0, 1.25), recorded(64, 5.5, 1.5)]
    shown, past = modelled_rows(rows, {"run": 4000.0}, "a100-40gb-pcie")
    gbps = gpus.copy_roofline_gbps("a100-40gb-pcie")[0]
    assert past == {} and [r["batch"] for r in shown] == [1, 64]
    for before, after in zip(rows, shown, strict=True):
        step_bytes = before["roofline_ms"] * 1e-3 * 4000e9
        assert after["step_bytes"] == pytest.approx(step_bytes)
        assert after["roofline_ms"] == pytest.approx(step_bytes / (gbps * 1e9) * 1e3)
        assert after["step_ms"] == pytest.approx(after["roofline_ms"] * before["ratio_to_roofline"])
        assert after["tokens_per_s"] == pytest.approx(after["batch"] / after["step_ms"] * 1e3)
        assert after["step_ms_runs"] == pytest.approx(
            [ms * after["step_ms"] / before["step_ms"] for ms in before["step_ms_runs"]])
        assert after["ratio_to_roofline"] == before["ratio_to_roofline"]
    assert rows[0]["step_ms"] == 5.0  # the rows themselves are left as they were


def test_modelled_rows_leave_out_a_batch_past_the_gpus_memory():
    # 6 ms at 4,000 GB/s: 24 GB a step, of which K, V of 128 x 640 tokens (10.7 GB)
    rows = [recorded(1, 4.0, 1.25), recorded(128, 6.0, 1.25)]
    shown, past = modelled_rows(rows, {"run": 4000.0}, "rtx4090")
    per_token = MODELS["llama3-8b"].kv_bytes_per_token() * 128
    weights = 24e9 - per_token * 640
    need = weights + per_token * 768
    assert [r["batch"] for r in shown] == [1] and list(past) == [128]
    assert past[128] == (f"llama3-8b at batch 128 needs at least {need / 1e9:,.1f} GB (the "
                         f"{weights / 1e9:,.1f} GB of weights a step reads, "
                         f"{per_token * 768 / 1e9:,.1f} GB of K, V for 128 x 768 tokens): past "
                         "the NVIDIA GeForce RTX 4090's 24 GB")
    assert modelled_rows(rows, {"run": 4000.0}, "h200")[1] == {}
    with pytest.raises(ValueError, match="gpu='x': must be one of"):
        modelled_rows(rows, {"run": 4000.0}, "x")


def traced(*kernels):
    """A steptrace row of `kernels`: (name, start_us, dur_us), its gaps and span from them."""
    ks = [{"name": n, "start_us": s, "dur_us": d} for n, s, d in kernels]
    end = max(k["start_us"] + k["dur_us"] for k in ks)
    busy = sum(k["dur_us"] for k in ks)
    return {"kernels": ks, "span_us": end, "gap_us": end - busy, "roofline_us": 10.0}


@pytest.mark.parametrize("signature, name", [
    ("void kvlab::linear<__half, 1, 4, 2, 2>(__half*, __half const*)", "linear"),
    ("nvjet_sm90_hsh_128x16_64x11_4x1_v_bz_splitK_TNT", "nvjet_sm90_hsh_128x16_64x11_4x1_v_bz_"
                                                        "splitK_TNT"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::Half>"
     ">(int, at::native::CUDAFunctor_add<c10::Half>)", "vectorized_elementwise_kernel"),
    ("rms_norm", "rms_norm"),
    ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::Half, long>(int)",
     "indexSelectSmallIndex"),
])
def test_a_traced_kernel_is_named_by_its_function(signature, name):
    assert kernel_name(signature) == name


def test_traced_kernels_are_grouped_with_their_bytes_at_the_roofline():
    from kvlab.predict.step import StepModel, step_anatomy

    row = traced(("void kvlab::rms_norm<__half, 1>(__half*)", 0.0, 1.0),
                 ("void kvlab::linear<__half, 1>(__half*)", 2.0, 5.0),
                 ("void kvlab::gqa_decode<__half>(__half*)", 7.0, 2.0),
                 ("nvjet_sm90_hsh_64x16_TNT", 9.5, 4.0), ("void mystery<1>(int)", 14.0, 1.0))
    anatomy = step_anatomy("llama3-8b", 1, 640, 4000.0, StepModel(2.0, 3.0, 0.2, 0, 0.0, 0.0))
    groups = trace_groups(row["kernels"], anatomy)
    assert [(g["group"], g["count"], g["busy_us"]) for g in groups] == [
        ("GEMMs", 2, 9.0), ("attention", 1, 2.0), ("norms", 1, 1.0), ("other", 1, 1.0)]
    modelled = {k["name"]: k["roofline_us"] for k in anatomy["kernels"]}
    assert groups[0]["roofline_us"] == pytest.approx(sum(
        modelled[n] for n in ("qkv", "w_o", "gate + up", "down", "lm head")))
    assert groups[1]["roofline_us"] == modelled["attention"]
    assert groups[-1]["roofline_us"] is None  # nothing of the model's is "other"
    assert all(g["roofline_us"] is None for g in trace_groups(row["kernels"]))


def test_a_traced_step_draws_each_kernel_where_it_ran_and_marks_the_gaps():
    row = traced(("linear", 0.0, 4.0), ("gqa_decode", 5.0, 2.0), ("linear", 7.5, 4.0))
    fig = trace_figure(row, trace_groups(row["kernels"]), "T", "p")
    gemms, attention, gaps, roofline, end = fig.data
    assert list(gemms.base) == [0.0, 0.0075] and list(gemms.x) == [0.004, 0.004]
    assert gemms.y[0] == "GEMMs x2" and attention.y[0] == "attention x1"
    assert list(gaps.base) == [0.004, 0.007] and list(gaps.x) == pytest.approx([0.001, 0.0005])
    assert gaps.marker.color == "#d62728" and gaps.y[0] == "between kernels x2"
    assert roofline.name == "the step's bytes at the copy roofline: 0.01 ms"
    assert end.name == "the step's end: 0.01 ms"
    assert "0.00 ms between kernels, the rest inside them" in fig.layout.title.text


@pytest.mark.parametrize("bad", [{}, None, {"kernels": [], "span_us": 1, "gap_us": 0,
                                            "roofline_us": 1},
                                 {"kernels": [{"name": "k", "start_us": 0, "dur_us": 1}],
                                  "span_us": 0, "gap_us": 0, "roofline_us": 1}])
def test_a_traced_step_needs_its_kernels_and_a_span(bad):
    with pytest.raises(ValueError, match="row: must hold kernels, span_us > 0"):
        trace_figure(bad, [{"group": "GEMMs"}], "T", "p")


def test_a_traced_kernel_without_its_times_is_refused():
    with pytest.raises(ValueError, match=r"kernels\[1\]=.*must be a dict of name, start_us"):
        trace_groups([{"name": "linear", "start_us": 0, "dur_us": 1}, {"name": "linear"}])
