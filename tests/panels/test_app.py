"""The whole dashboard as a browser gets it: every chart's output is valid JSON (CPU)."""

import json

from factories import non_finite_paths

import kvlab
from kvlab.panels.widgets import PLOTLY_MIME


def test_every_figure_of_every_tab_can_be_sent_to_the_browser(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dashboard = kvlab.dashboard()
    for tab, figures in dashboard.figures.items():
        for name, pane in figures.items():
            (output,) = pane.outputs  # what the widget's state sends to the browser
            assert output["output_type"] == "display_data", (tab, name)
            assert non_finite_paths(output["data"][PLOTLY_MIME]) == [], (tab, name)
            json.dumps(pane.outputs, allow_nan=False)


def test_export_writes_each_charts_csv_and_a_report_of_the_selected_tab(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dashboard = kvlab.dashboard()
    dashboard.tab_widget.selected_index = 1
    paths = dashboard.export(folder=tmp_path)
    tab = dashboard.tabs[1]
    assert [p.name for p in paths] == [*(f"{tab.key}-{n}.csv" for n in tab.figures),
                                       f"{tab.key}.html"]
    csv = paths[0].read_text()
    assert csv.startswith("# ") and "recorded on NVIDIA H200" in csv
    assert len(csv.splitlines()) > 5
    report = paths[-1].read_text()
    assert "<th>model</th>" in report and report.count("<h2>") == len(tab.figures)
    assert tab.title in dashboard.export_links.value and "href=" in dashboard.export_links.value
