"""kvlab.viz.e2e: throughput against batch per variant with HF and the roofline; step times."""

import pytest

from kvlab.viz.e2e import TITLES, steps_figure, tensor_parallel_figure, throughput_figure


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
