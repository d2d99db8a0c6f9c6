"""The overlap of link and GPU that a step's stream spans show."""

import pytest

from kvlab.offload.overlap import overlap


def span(lane, start, end):
    return {"lane": lane, "name": "x", "layer": 0, "start_us": start, "end_us": end}


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ([span("H2D", 0, 100), span("compute", 0, 40)], 1.0),  # all compute under the link
        ([span("H2D", 0, 100), span("compute", 100, 140)], 0.0),  # one after the other
        ([span("H2D", 0, 100), span("compute", 80, 120)], 0.5),  # half of it
        # side by side, but with a gap where both wait (the host): the step saved nothing
        ([span("H2D", 0, 50), span("compute", 0, 50), span("H2D", 150, 200),
          span("compute", 150, 200)], 0.0),
    ],
)
def test_overlap_is_the_hidden_share_of_the_shorter_activity(spans, expected):
    got = overlap(spans)
    assert got["overlap"] == pytest.approx(expected)
    assert got["link_busy_ms"] == pytest.approx(0.1)
