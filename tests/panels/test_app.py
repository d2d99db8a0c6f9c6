"""The whole dashboard as a browser gets it: every chart's output is valid JSON (CPU)."""

import json
import pathlib
import re

import pytest
from factories import non_finite_paths

import kvlab
from kvlab.panels import app
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


@pytest.fixture
def dash(monkeypatch, tmp_path):
    """The dashboard on "sim", its working directory an empty tmp_path."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.chdir(tmp_path)
    return kvlab.dashboard()


def test_export_takes_a_folder_named_by_a_str(dash, tmp_path):
    paths = dash.export(folder="out")
    assert [p.parent for p in paths] == [pathlib.Path("out")] * len(paths)
    assert (tmp_path / "out" / "paged_cache.html").is_file()


@pytest.mark.parametrize("folder", [5, b"out", ["out"], ""])
def test_export_refuses_a_folder_of_another_type_naming_it(dash, tmp_path, folder):
    with pytest.raises(ValueError, match=re.escape(f"folder={folder!r}: must be a str or "
                                                   "os.PathLike")):
        dash.export(folder=folder)
    assert list(tmp_path.iterdir()) == []


def test_two_exports_in_one_second_get_a_folder_each(dash, monkeypatch):
    monkeypatch.setattr(app.time, "strftime", lambda fmt: "20270102-030405")
    first = dash.export()
    dash.tab_widget.selected_index = 2
    second = dash.export()
    assert first[0].parent == pathlib.Path("kvlab-export/20270102-030405")
    assert second[0].parent == pathlib.Path("kvlab-export/20270102-030405-2")
    assert all(p.is_file() for p in first + second)
    assert first[-1].name == "paged_cache.html" and second[-1].name == "kvpr.html"


def test_export_never_writes_through_a_planted_link(dash, tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "paged_cache.html").symlink_to(victim)
    with pytest.raises(ValueError, match=re.escape("holds ['paged_cache.html'] already")):
        dash.export(folder=tmp_path / "out")
    assert victim.read_text() == "precious"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["paged_cache.html"]
    # a link planted at the default folder's name: passed over, its target left alone
    monkeypatch.setattr(app.time, "strftime", lambda fmt: "stamp")
    (tmp_path / "kvlab-export").mkdir()
    (tmp_path / "kvlab-export" / "stamp").symlink_to(tmp_path / "out")
    paths = dash.export()
    assert paths[0].parent == pathlib.Path("kvlab-export/stamp-2")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["paged_cache.html"]


def test_the_button_shows_why_an_export_failed(dash, tmp_path):
    (tmp_path / "kvlab-export").write_text("a file where the folder goes")
    dash.export_button.click()
    assert "export failed" in dash.export_links.value
    assert "kvlab-export" in dash.export_links.value
