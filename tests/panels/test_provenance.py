"""Every tab that draws recordings carries, on a chart, the label of what it draws: where, when,
at which revision and what changed since (kvlab.results.label), on the simulated backend (CPU).
The paged-cache tab draws no recording: its charts are computed from block accounting."""

import html
import re

import pytest

from kvlab.panels.decode_kernels import DecodeKernelsTab
from kvlab.panels.e2e import EndToEndTab
from kvlab.panels.kvpr import KVPRTab
from kvlab.panels.l2 import L2Tab

# "recorded on <GPU>, <date> at <revision>", then notes: the label's head
LABELLED = re.compile(r"recorded on NVIDIA H200, \d{4}-\d{2}-\d{2}[^<]* at [0-9a-f]{7}")


@pytest.mark.parametrize("make", [DecodeKernelsTab, EndToEndTab, KVPRTab,
                                  lambda: L2Tab(batch=2, context=1024)])
def test_a_chart_of_each_tab_names_the_revision_of_its_recording(monkeypatch, make):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    tab = make()
    titles = [html.unescape(p.figure.layout.title.text or "") for p in tab.figures.values()]
    assert any(LABELLED.search(t) for t in titles), titles
