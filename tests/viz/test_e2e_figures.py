"""kvlab.viz.e2e: throughput against batch per variant with HF and the roofline; step times."""

import pytest

from kvlab.viz.e2e import steps_figure, throughput_figure


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


def test_steps_has_a_line_per_run():
    fig = steps_figure({"gqa": [3.0, 2.0], "hf-static": [5.0]}, "Steps", "measured on Y")
    assert [list(t.y) for t in fig.data] == [[3.0, 2.0], [5.0]] and list(fig.data[0].x) == [1, 2]
