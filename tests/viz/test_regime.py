"""The regime map: the best prefetch setting per (SM count, point), from same-loop ratios (CPU)."""

import pytest

from kvlab.viz.regime import regime_cells, regime_figure


def row(sms, prefetch, ms, kernel="vllm_v1", model="llama2-7b", batch=8, context=4096,
        heads=(32, 32)):
    return {"sms": sms, "kernel": kernel, "model": model, "batch": batch, "context": context,
            "block_size": 16, "prefetch": prefetch, "ms": ms, "num_qo_heads": heads[0],
            "num_kv_heads": heads[1]}


ROWS = [
    row(132, "none", 1.0), row(132, "bulk K+V d=1", 1.25), row(132, "line K+V d=1", 1.1),
    row(32, "none", 3.0), row(32, "bulk K+V d=1", 2.5), row(32, "line K+V d=1", 2.9),
    row(132, "none", 0.5, model="llama3-8b", heads=(32, 8)),
    row(132, "bulk K+V d=1", 0.4, model="llama3-8b", heads=(32, 8)),
    row(132, "none", 9.0, kernel="gqa"), row(132, "bulk K+V d=1", 1.0, kernel="gqa"),
    row(32, "bulk K+V d=1", 1.0, context=8192),  # no no-prefetch twin: left out
]


def test_cells_keep_the_best_setting_of_each_sm_count_and_point():
    cells = {(c["sms"], c["model"]): c for c in regime_cells(ROWS, "vllm_v1")}
    assert set(cells) == {(132, "llama2-7b"), (32, "llama2-7b"), (132, "llama3-8b")}
    assert cells[132, "llama2-7b"]["speedup"] == pytest.approx(1 / 1.1)
    assert cells[132, "llama2-7b"]["prefetch"] == "line K+V d=1"
    assert cells[32, "llama2-7b"]["speedup"] == pytest.approx(3.0 / 2.5)
    assert cells[132, "llama3-8b"]["group"] == 4 and cells[132, "llama3-8b"]["tokens"] == 32768


def test_figure_has_one_row_per_sm_count_and_gaps_where_nothing_was_timed():
    fig = regime_figure(ROWS, "vllm_v1", "recorded on NVIDIA H200, 2026-12-02")
    heatmap = fig.data[0]
    assert list(heatmap.y) == ["32 SMs", "132 SMs"]
    assert list(heatmap.x) == ["llama2-7b (1:1) 8 x 4k", "llama3-8b (4:1) 8 x 4k"]
    assert heatmap.z[0][1] is None  # llama3-8b was not timed on 32 SMs
    assert heatmap.z[0][0] == pytest.approx(1.2)
    assert (heatmap.text[0][0], heatmap.customdata[0][0]) == ("1.20", "bulk K+V d=1")
    assert "recorded on NVIDIA H200, 2026-12-02" in fig.layout.title.text


def test_rows_without_sms_are_the_whole_gpu():
    rows = [{**r, "sms": None} for r in ROWS[:3]]
    assert list(regime_figure(rows, "vllm_v1", "p").data[0].y) == ["whole GPU"]


def test_no_pair_is_an_error_naming_the_kernel():
    with pytest.raises(ValueError, match="kernel='gqa', block_size=32: no loop with prefetch"):
        regime_figure(ROWS, "gqa", "p", block_size=32)


def test_each_column_is_labelled_on_one_upright_line():
    """Some 15 px a column on a 500 px chart: a label of two lines, or turned only once labels
    collide, overlaps its neighbours."""
    rows = ROWS + [row(132, "none", 1.0, context=1000), row(132, "bulk K+V d=1", 0.9, context=1000)]
    fig = regime_figure(rows, "vllm_v1", "p")
    assert fig.layout.xaxis.tickangle == -90
    assert not any("<br>" in x for x in fig.data[0].x)
    assert "llama2-7b (1:1) 8 x 1000" in fig.data[0].x  # not a multiple of 1024: as is
