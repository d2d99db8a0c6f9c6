"""Kernel figures: bars are the rows' GB/s, speedups are ms ratios, titles carry provenance."""

import pytest

from kvlab.results import ATTENTION, label, load_result, load_results, nearest_rows
from kvlab.viz.kernels import (
    bandwidth_figure,
    block_order_figure,
    mixed_figure,
    prefetch_speedup_figure,
    variant,
)

PROVENANCE = "recorded on TEST GPU, 2026-01-01"


def make_row(kernel="gqa", prefetch="none", ms=1.0, batch=16, context=1024, gbps=1000.0):
    return {
        "model": "llama3-8b",
        "batch": batch,
        "context": context,
        "kernel": kernel,
        "prefetch": prefetch,
        "block_size": None if kernel == "sdpa" else 16,
        "ms": ms,
        "gbps": gbps,
    }


def test_bandwidth_figure_draws_recorded_rows():
    result = load_result("h200", "attention")
    rows = nearest_rows(result, "llama3-8b", 64, 8192)
    roofline = result["roofline_copy_gbps"]
    fig = bandwidth_figure(rows, roofline, label(result), selected="gqa / line K+V d=1")
    bars, *keys, roofline_key = fig.data
    assert [k.name for k in keys] == ["vllm_v1", "gqa", "auto: kvlab's choice",
                                      "sdpa (PyTorch, dense K, V)"]
    assert roofline_key.name == f"copy roofline {roofline:.0f} GB/s" and not bars.showlegend
    assert "auto = tuned here, reused from its bucket, or recorded" in fig.layout.title.text
    assert list(bars.x) == [r["gbps"] for r in rows]
    assert list(bars.y) == [variant(r) for r in rows]
    assert len(set(bars.y)) == len(rows)  # one bar each, "auto (vllm_v1)" and "auto (gqa)" too
    assert list(bars.text) == [f"{100 * r['gbps'] / roofline:.0f}%" for r in rows]
    assert [s.x0 for s in fig.layout.shapes] == [roofline]
    assert "recorded on NVIDIA H200" in fig.layout.title.text and fig.layout.height
    widths = bars.marker.line.width
    assert widths[list(bars.y).index("gqa / line K+V d=1")] > 0 and sum(w > 0 for w in widths) == 1


def test_the_dashboards_recorded_point_has_a_read_of_its_bytes_from_its_own_run():
    result = load_results(*ATTENTION)
    rows = nearest_rows(result, "qwen2.5-7b", 1, 32768)
    read = [r for r in rows if r["kernel"] == "read"]
    assert [r["source"] for r in read] == ["attention_read"]
    # gqa's and SDPA's rows of that run are left to the grid's, whose loop holds every setting
    assert {r["source"] for r in rows if r["block_size"] in (16, None)
            and r["kernel"] != "read"} == {"attention"}
    fig = bandwidth_figure([r for r in rows if r["block_size"] in (16, None)],
                           result["roofline_copy_gbps"], label(result, rows))
    bars, *keys, _ = fig.data
    assert "read" in list(bars.y)
    assert keys[-1].name == "read: the same bytes, one plain read (the bound at this size)"
    assert read[0]["gbps"] > max(r["gbps"] for r in rows if r["kernel"] != "read")


def test_flashinfer_rows_get_their_own_colour_and_legend_entry():
    from kvlab.viz.kernels import KERNEL_COLORS

    kernels = ["gqa", "flashinfer", "flashinfer_tc", "flashinfer_fp8", "flashinfer_tc_fp8"]
    rows = [make_row(kernel=k, ms=1.0 + i / 10) for i, k in enumerate(kernels)]
    bars, *keys, _ = bandwidth_figure(rows, 4000.0, PROVENANCE).data
    assert list(bars.marker.color) == [KERNEL_COLORS[k] for k in kernels]
    assert len(set(bars.marker.color)) == len(kernels)  # none falls back to gray
    assert [k.name for k in keys] == [
        "gqa", "FlashInfer decode (CUDA cores, gqa's K/V)", "FlashInfer decode on the fp8 cache",
        "FlashInfer, tensor-core path (gqa's K/V)", "FlashInfer, tensor cores, fp8 cache"]


def test_bandwidth_figure_rejects_mixed_points():
    rows = [make_row(), make_row(batch=64)]
    with pytest.raises(ValueError, match="2 \\(model, batch, context\\) points"):
        bandwidth_figure(rows, 4000.0, PROVENANCE)
    with pytest.raises(ValueError, match="rows is empty"):
        bandwidth_figure([], 4000.0, PROVENANCE)


def test_prefetch_speedup_is_ms_none_over_ms_prefetch():
    rows = [
        make_row(prefetch="none", ms=2.0),
        make_row(prefetch="line K+V d=1", ms=1.0),
        make_row(prefetch="bulk K+V d=1", ms=4.0),
        make_row(prefetch="none", ms=3.0, batch=64),
        make_row(prefetch="line K+V d=1", ms=2.0, batch=64),
        make_row(kernel="vllm_v1", prefetch="line K+V d=1", ms=0.1),  # other kernel: ignored
        make_row(kernel="sdpa", ms=0.1),
    ]
    fig = prefetch_speedup_figure(rows, "gqa", "llama3-8b", PROVENANCE)
    line, bulk = fig.data
    assert (line.name, bulk.name) == ("line K+V d=1", "bulk K+V d=1")
    assert list(line.x) == ["16 x 1024", "64 x 1024"]
    assert list(line.y) == pytest.approx([2.0, 1.5])
    assert bulk.y[0] == pytest.approx(0.5) and bulk.y[1] is None  # not measured at B=64
    assert [s.y0 for s in fig.layout.shapes] == [1.0]
    title = fig.layout.title.text
    assert PROVENANCE in title and "1.84-2.15x" in title and "2504.06319" in title


def test_prefetch_speedup_on_the_recorded_grid():
    result = load_result("h200", "attention")
    fig = prefetch_speedup_figure(result["rows"], "vllm_v1", "llama2-7b", label(result))
    # bulk and line at distances 1, 2, 4; 4 x 4 points but B=128 x 32k (64 GiB) was skipped
    assert len(fig.data) == 6 and len(fig.data[0].x) == 15
    assert all(0.2 < s < 5 for t in fig.data for s in t.y)


def test_prefetch_speedup_unknown_kernel_or_model():
    with pytest.raises(ValueError, match="kernel='gqa', model='qwen2.5-7b'"):
        prefetch_speedup_figure([make_row()], "gqa", "qwen2.5-7b", PROVENANCE)


def test_mixed_figure_groups_each_kernel_by_batch():
    def row(kernel, batch, pct, prefetch="none", loop=0):
        return {"model": "llama3-8b", "lengths": "lognormal:100,200", "batch": batch,
                "context": batch + 1, "max_context": 200, "kernel": kernel,
                "prefetch": prefetch, "pct_roofline": pct, "loop": loop}

    rows = [row("gqa", 64, 90.0), row("vllm_v1", 64, 40.0), row("gqa", 16, 60.0),
            row("gqa", 16, 1.0, loop=1), row("gqa", 16, 2.0, prefetch="bulk"),
            {**row("gqa", 16, 3.0), "lengths": "lognormal:100,300"}]
    fig = mixed_figure(rows, "llama3-8b", "lognormal:100,200", PROVENANCE)
    # kernels in the colour map's order; batches ascending; the first loop of a setting
    assert [d.name for d in fig.data] == ["vllm_v1", "gqa"]
    vllm, gqa = fig.data
    assert list(gqa.x) == ["16 x ~17 (max 200)", "64 x ~65 (max 200)"]
    assert list(gqa.y) == [60.0, 90.0] and list(vllm.y) == [None, 40.0]
    assert PROVENANCE in fig.layout.title.text
    with pytest.raises(ValueError, match="no rows of lengths"):
        mixed_figure(rows, "qwen2.5-7b", "lognormal:100,200", PROVENANCE)


def test_block_order_figure_plots_each_ratio_of_one_loop():
    def row(kernel, ms, batch=16, loop=0, prefetch="none"):
        return {**make_row(kernel, prefetch, ms, batch=batch), "loop": loop}

    rows = [row("vllm_v1", 2.0), row("vllm_v1_in_order", 1.6), row("gqa", 1.0),
            row("gqa", 0.5, prefetch="bulk K+V d=1"), row("gqa_in_order", 0.8),
            row("sdpa", 0.9),
            # batch 64: gqa only, without SDPA; another loop's rows never pair with these
            row("gqa", 3.0, batch=64, loop=1), row("gqa_in_order", 2.0, batch=64, loop=1),
            row("gqa_in_order", 0.1, batch=64, loop=2),
            # the same point timed again in a later loop: the first loop's ratios stand
            row("gqa", 5.0, batch=64, loop=3), row("gqa_in_order", 1.0, batch=64, loop=3)]
    fig = block_order_figure(rows, "llama3-8b", PROVENANCE)
    ratios = {d.name: list(d.y) for d in fig.data}
    assert list(fig.data[0].x) == ["16 x 1024", "64 x 1024"]
    assert ratios == {"vllm_v1: in order / scattered": [pytest.approx(1.25), None],
                      "gqa: in order / scattered": [pytest.approx(1.25), pytest.approx(1.5)],
                      "gqa / SDPA, scattered": [pytest.approx(0.9), None],
                      "gqa / SDPA, in order": [pytest.approx(0.9 / 0.8), None]}
    assert PROVENANCE in fig.layout.title.text
    with pytest.raises(ValueError, match="no point with blocks in order and scattered"):
        block_order_figure(rows[2:4] + rows[5:6], "llama3-8b", PROVENANCE)


def test_gpu_speedup_figure_draws_a_cell_per_gpu_and_point_blank_where_none():
    from kvlab.viz.kernels import gpu_speedup_figure

    speedups = {"NVIDIA H20": {"1 x 4096": 1.07, "64 x 8192": 1.02},
                "NVIDIA L40S": {"1 x 4096": None, "64 x 8192": None},
                "NVIDIA H200": {"1 x 4096": 1.07, "64 x 8192": 0.92}}
    fig = gpu_speedup_figure(speedups, "llama3-8b, vllm_v1", "modelled by kvlab.predict")
    (heat,) = fig.data
    assert list(heat.y) == list(speedups) and list(heat.x) == ["1 x 4096", "64 x 8192"]
    assert list(heat.text[1]) == ["", ""] and list(heat.text[2]) == ["1.07x", "0.92x"]
    assert heat.zmid == 1.0
    assert (heat.zmin, heat.zmax) == (pytest.approx(0.92), pytest.approx(1.08))
    assert "modelled by kvlab.predict" in fig.layout.title.text
    with pytest.raises(ValueError, match="speedups is empty"):
        gpu_speedup_figure({}, "x", "y")
    with pytest.raises(ValueError, match=r"speedups\['b'\] has points \['2'\]: must have \['1'\]"):
        gpu_speedup_figure({"a": {"1": 1.0}, "b": {"2": 1.0}}, "x", "y")


def test_a_modelled_bar_is_hatched_with_its_band_as_a_whisker():
    rows = [{"model": "m", "batch": 1, "context": 8, "kernel": "gqa", "prefetch": "none",
             "block_size": 16, "ms": 1.0, "gbps": 100.0},
            {"model": "m", "batch": 1, "context": 8, "kernel": "vllm_v1", "prefetch": "none",
             "block_size": 16, "ms": 1.0, "gbps": 80.0, "basis": "extrapolated",
             "gbps_band": (70.0, 95.0)}]
    fig = bandwidth_figure(rows, 200.0, "p")
    bars = fig.data[0]
    assert list(bars.marker.pattern.shape) == ["", "/"]
    assert list(bars.error_x.array) == [0, 15.0] and list(bars.error_x.arrayminus) == [0, 10.0]
    assert "modelled (extrapolated)" in bars.customdata[1][2]
    assert any(d.name and d.name.startswith("hatched: modelled") for d in fig.data)
    assert not any(d.name and d.name.startswith("hatched") for d in bandwidth_figure(
        rows[:1], 200.0, "p").data)
