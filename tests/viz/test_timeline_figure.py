"""The traced-step figure: every CTA drawn on its SM's row, phase by phase, CTAs sharing an SM
kept apart, the spans marked, and a row without a trace refused."""

import pytest

from kvlab.results import load_result
from kvlab.viz.timeline import DECODE_PHASES, _rows, timeline_figure

PROVENANCE = "recorded on TEST GPU, 2026-01-01"


def recorded_row(batch, context, model="llama3-8b"):
    return next(r for r in load_result("h200", "timeline")["rows"]
                if (r["model"], r["batch"], r["context"]) == (model, batch, context))


def test_ctas_sharing_an_sm_get_rows_apart_within_it():
    assert _rows([3, 5, 3]) == [2.8, 5.0, 3.2]
    ys = _rows([0] * 4)
    assert ys == sorted(ys) and max(ys) - min(ys) < 1 and sum(ys) == pytest.approx(0)


def test_each_phase_is_a_segment_per_cta():
    row = recorded_row(1, 32768)
    fig = timeline_figure(row, PROVENANCE)
    decode = row["trace"]["decode"]
    for start, stop, name, _, _ in DECODE_PHASES:
        trace = next(d for d in fig.data if d.name == name)
        assert list(trace.x[0::3]) == [t / 1000 for t in decode[start]]
        assert list(trace.x[1::3]) == [t / 1000 for t in decode[stop]]
        assert [round(y) for y in trace.y[0::3]] == decode["sm"]
    merge = next(d for d in fig.data if d.name.startswith("merge: loads"))
    assert len(merge.x) == 3 * len(row["trace"]["merge"]["sm"])
    read = next(d for d in fig.data if d.name.startswith("read"))
    assert len(read.x) == 3 * row["phases"]["read_ctas"]
    assert PROVENANCE in fig.layout.title.text
    spans = sorted(shape.x0 for shape in fig.layout.shapes)
    assert spans == sorted([row["phases"]["step_span_us"], row["phases"]["read_span_us"]])


def test_a_step_without_a_merge_draws_none_and_a_row_without_a_trace_is_refused():
    row = recorded_row(16, 1024)
    fig = timeline_figure(row, PROVENANCE, note="a note")
    assert not any(d.name.startswith("merge") for d in fig.data)
    assert "a note" in fig.layout.title.text
    with pytest.raises(ValueError, match="row has no trace"):
        timeline_figure({**row, "trace": None}, PROVENANCE)
