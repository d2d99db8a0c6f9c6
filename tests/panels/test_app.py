"""The whole dashboard as a browser gets it: every chart's output is valid JSON, exports, and a
pinned setting drawn beside the live one (CPU)."""

import html
import json
import pathlib
import re
import shutil
import subprocess

import ipywidgets as widgets
import pytest
from factories import non_finite_paths

import kvlab
from kvlab.panels import app
from kvlab.panels.widgets import PLOTLY_MIME, show_figure
from kvlab.viz.layout import note_figure


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
    assert f"{tab.title} exported to <code>{tmp_path}</code>" in dashboard.export_links.value


@pytest.fixture
def dash(monkeypatch, tmp_path):
    """The dashboard on "sim", its working directory an empty tmp_path."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.chdir(tmp_path)
    return kvlab.dashboard()


def test_the_dashboard_builds_its_first_tab_at_once_and_each_other_when_selected(dash):
    first, *others = dash.tabs
    assert first.figures["memory"].outputs  # drawn
    for tab in others:
        assert isinstance(tab, app.LazyTab) and "building" in tab.widget.children[0].value
    dash.tab_widget.selected_index = 3
    l2 = dash.tabs[3]
    assert l2.key == "l2" and l2.widget.children == (l2.build().widget,)
    assert all(pane.outputs for pane in l2.figures.values())
    assert all("building" in tab.widget.children[0].value for tab in others if tab is not l2)


def test_a_lazy_tab_is_built_once_on_first_use_and_never_for_a_private_name():
    built = []

    class Tab:
        controls, figures, widget = {"go": widgets.Button()}, {}, widgets.HTML("built")

        def __init__(self):
            built.append(self)

    tab = app.LazyTab(Tab, "fake", "Fake <tab>")
    assert "building Fake &lt;tab&gt;..." in tab.widget.children[0].value
    with pytest.raises(AttributeError):
        _ = tab._anything
    assert built == [] and (tab.key, tab.title) == ("fake", "Fake <tab>")
    assert list(tab.controls) == ["go"] and tab.widget.children == (Tab.widget,)
    assert tab.build() is built[0] and len(built) == 1


def test_export_takes_a_folder_named_by_a_str_and_gives_full_paths(dash, tmp_path):
    paths = dash.export(folder="out")
    assert [p.parent for p in paths] == [tmp_path / "out"] * len(paths)
    assert (tmp_path / "out" / "paged_cache.html").is_file()


@pytest.mark.parametrize("folder", [5, b"out", ["out"], ""])
def test_export_refuses_a_folder_of_another_type_naming_it(dash, tmp_path, folder):
    with pytest.raises(ValueError, match=re.escape(f"folder={folder!r}: must be a str or "
                                                   "os.PathLike")):
        dash.export(folder=folder)
    assert list(tmp_path.iterdir()) == []


def test_two_exports_in_one_second_get_a_folder_each(dash, monkeypatch, tmp_path):
    monkeypatch.setattr(app.time, "strftime", lambda fmt: "20270102-030405")
    first = dash.export()
    dash.tab_widget.selected_index = 2
    second = dash.export()
    assert first[0].parent == tmp_path / "kvlab-export" / "20270102-030405"
    assert second[0].parent == tmp_path / "kvlab-export" / "20270102-030405-2"
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
    assert paths[0].parent == tmp_path / "kvlab-export" / "stamp-2"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["paged_cache.html"]


def test_the_button_shows_why_an_export_failed(dash, tmp_path):
    (tmp_path / "kvlab-export").write_text("a file where the folder goes")
    dash.export_button.click()
    assert "export failed" in dash.export_links.value
    assert "kvlab-export" in dash.export_links.value


# Where an export goes and how the message shows it.

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_default_folder_is_kvlab_export_in_the_working_directory_and_git_ignores_it(dash,
                                                                                        tmp_path):
    paths = dash.export()
    assert all(p.parent.parent == tmp_path / "kvlab-export" for p in paths)
    assert f"<code>{paths[0].parent}</code>" in dash.export_links.value  # the full path
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the git checkout")
    for path in ("notebooks/kvlab-export/20270102-030405/paged_cache.html", "kvlab-export/a.csv"):
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", path])
        assert ignored.returncode == 0, f"{path}: not ignored by .gitignore"


def test_export_goes_under_the_folder_the_person_chose(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(app.time, "strftime", lambda fmt: "stamp")
    dash = kvlab.dashboard(export_folder="~/kvlab exports")
    paths = dash.export()
    assert paths[-1] == tmp_path / "home" / "kvlab exports" / "stamp" / "paged_cache.html"
    assert paths[-1].is_file() and "kvlab exports" in dash.export_button.tooltip
    assert f"<code>{tmp_path / 'home' / 'kvlab exports' / 'stamp'}</code>" in (
        dash.export_links.value)


@pytest.mark.parametrize("folder", [5, b"out", ""])
def test_an_export_folder_of_another_type_is_refused_naming_it(folder):
    with pytest.raises(ValueError, match=re.escape(f"export_folder={folder!r}: must be a str")):
        app.Dashboard([], export_folder=folder)


def test_an_export_folder_that_is_or_is_in_a_file_is_refused_naming_it(tmp_path):
    """It was taken, and each export failed with "File exists" beside the button."""
    file = tmp_path / "notes.txt"
    file.write_text("")
    for folder in (file, file / "exports"):
        with pytest.raises(ValueError, match=re.escape(f"export_folder={folder!r}: {file} is not "
                                                       "a folder")):
            app.Dashboard([], export_folder=folder)
    assert app.Dashboard([], export_folder=tmp_path / "new" / "exports").export_folder == (
        tmp_path / "new" / "exports")


def fake_server(monkeypatch, tmp_path, base_url="/user/me/", root=None, name="jpserver"):
    """This process's parent a Jupyter server serving `root` (default tmp_path) at `base_url`,
    as the file it describes itself in says."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(exist_ok=True)
    root_key = "root_dir" if name == "jpserver" else "notebook_dir"
    (runtime / f"{name}-4242.json").write_text(json.dumps(
        {"base_url": base_url, root_key: str(root or tmp_path), "pid": 4242}))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("JPY_PARENT_PID", "4242")


def test_links_open_the_files_through_the_servers_files_route_in_a_tab_of_their_own(
        dash, monkeypatch, tmp_path):
    fake_server(monkeypatch, tmp_path)
    monkeypatch.setattr(app.time, "strftime", lambda fmt: "stamp")
    paths = dash.export()
    links = re.findall(r"<a href='([^']*)' target='_blank'[^>]*>([^<]*)</a>",
                       dash.export_links.value)
    assert [name for _, name in links] == ["paged_cache.html"] + [p.name for p in paths[:-1]]
    assert links[0][0] == "/user/me/files/kvlab-export/stamp/paged_cache.html"
    assert "noreferrer" not in dash.export_links.value  # the server checks the Referer
    assert "/lab/tree" not in dash.export_links.value  # not JupyterLab's untrusted viewer


def test_classic_notebook_servers_are_found_too(dash, monkeypatch, tmp_path):
    fake_server(monkeypatch, tmp_path, base_url="/", name="nbserver")
    dash.export(folder="my exports")
    assert "href='/files/my%20exports/paged_cache.html'" in dash.export_links.value


@pytest.mark.parametrize("where", ["outside the root", "hidden", "no server"])
def test_a_file_the_server_does_not_serve_is_named_without_a_link(dash, monkeypatch, tmp_path,
                                                                  where):
    root = tmp_path / "root"
    root.mkdir()
    fake_server(monkeypatch, tmp_path, root=root)
    if where == "no server":
        monkeypatch.delenv("JPY_PARENT_PID")
    folder = root / ".hidden" if where == "hidden" else tmp_path / "out"
    paths = dash.export(folder=folder if where != "no server" else root / "out")
    assert "href=" not in dash.export_links.value
    assert f"<code>{paths[0].parent}</code>" in dash.export_links.value
    assert "paged_cache.html" in dash.export_links.value


def test_files_url_is_the_quoted_path_under_the_root():
    server = ("/base/", pathlib.Path("/srv/lab"))
    assert app.files_url("/srv/lab/a b/r#1.html", server) == "/base/files/a%20b/r%231.html"
    assert app.files_url("/srv/lab", server) is None
    assert app.files_url("/srv/other/r.html", server) is None
    assert app.files_url("/srv/lab/r.html", None) is None


def test_the_buttons_label_is_never_cut_and_the_message_wraps(dash):
    assert dash.export_button.description == "Export this tab"
    assert dash.export_button.layout.width == "auto"  # as wide as its label (see tests/browser)
    assert dash.export_links.layout.min_width == "0"


def test_each_csv_names_its_columns_by_the_axis_titles(dash):
    paths = dash.export(folder="out")
    dash.tab_widget.selected_index = 2
    paths += dash.export(folder="out2")
    headers = {p.name: next(line for line in p.read_text().splitlines()
                            if not line.startswith("# ")) for p in paths if p.suffix == ".csv"}
    assert headers["paged_cache-memory.csv"] == "trace,type,x,y: GiB"
    assert headers["paged_cache-fragmentation.csv"] == (
        'trace,type,"x: block_size (tokens, log2 scale)",y: internal fragmentation (%),'
        "y: paged reserved (GiB)")
    assert headers["kvpr-overlap.csv"] == ("trace,type,x start: time from the step's start (us),"
                                            "x end: time from the step's start (us),y")


def test_no_tab_is_narrower_than_its_title(monkeypatch):
    """ipywidgets lets a tab shrink below its title: at 1,000 px (the file browser open) "L2 and
    counters" was cut; the dashboard's tabs keep their titles whole (seen in Chromium)."""
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dash = kvlab.dashboard()
    assert "kvlab-tabs" in dash.tab_widget._dom_classes
    assert app.TAB_STYLE in dash.header.value and "min-width: fit-content" in app.TAB_STYLE


# A pinned setting, drawn beside the live one and exported with it.

def test_a_pinned_setting_is_drawn_beside_the_live_one_as_a_control_changes(dash):
    label = dash.pin("paged_cache")
    assert {"model=llama3-8b", "block_size=16", "num_requests=256"} <= set(label.split(", "))
    dash.controls["paged_cache"]["block_size"].value = 64
    memory = dash.figures["paged_cache"]["memory"].figure
    live = [t.name for t in memory.data if t.legendgroup != "pinned"]
    pinned = [t.name for t in memory.data if t.name.startswith("pinned: ")]
    assert pinned == [f"pinned: {name}" for name in live]
    assert "paged, block_size=64" in memory.data[0].x[0]
    assert "paged, block_size=16" in memory.data[len(live)].x[0]  # the values when pinned
    assert memory.layout.title.text.endswith("<sub>pinned: block_size=16</sub>")
    assert html.escape(label) in dash.pin_line.value and not dash.unpin_button.disabled
    dash.unpin()
    memory = dash.figures["paged_cache"]["memory"]
    assert memory.figure is memory.live and not any(
        t.name.startswith("pinned") for t in memory.figure.data)
    assert "pinned" not in memory.figure.layout.title.text
    assert dash.pin_line.value == "" and dash.unpin_button.disabled


def test_the_buttons_pin_and_clear_the_selected_tab_and_the_line_follows_the_tab(dash):
    assert dash.unpin_button.disabled  # nothing pinned yet
    dash.tab_widget.selected_index = 4
    dash.pin_button.click()
    e2e = dash.tabs[4]
    label = app.setting_label(app.control_values(e2e.controls))
    assert all(pane.pinned.label == label for pane in e2e.figures.values())
    assert not any(pane.pinned for pane in dash.figures["paged_cache"].values())
    assert html.escape(label) in dash.pin_line.value
    dash.tab_widget.selected_index = 0
    assert dash.pin_line.value == "" and dash.unpin_button.disabled
    dash.tab_widget.selected_index = 4
    assert html.escape(label) in dash.pin_line.value and not dash.unpin_button.disabled
    dash.unpin_button.click()
    assert not any(pane.pinned for pane in e2e.figures.values())
    assert dash.pin_line.value == ""


def test_a_setting_label_names_each_controls_value_short():
    controls = {"block_size": widgets.IntSlider(value=16), "fraction": widgets.FloatSlider(
        value=0.5), "model": widgets.Dropdown(options=["llama3-8b"]), "go": widgets.Button()}
    assert app.setting_label(app.control_values(controls)) == (
        "block_size=16, fraction=0.5, model=llama3-8b")


def test_pinning_again_replaces_the_pin(dash):
    dash.pin()
    dash.controls["paged_cache"]["block_size"].value = 32
    assert "block_size=32" in dash.pin()
    memory = dash.figures["paged_cache"]["memory"].figure
    assert sum(t.name.startswith("pinned: ") for t in memory.data) == 4  # not 8
    assert memory.layout.title.text.endswith("<sub>pinned: the setting shown</sub>")
    assert "block_size=16" not in dash.pin_line.value


def test_a_note_under_a_pin_is_drawn_and_says_the_pin_is_not(dash):
    dash.pin()
    pane = dash.figures["paged_cache"]["memory"]
    show_figure(pane, note_figure("KV memory", "computed", "nothing to draw", 420))  # as a tab
    assert not pane.figure.data and pane.figure.layout.annotations  # the note, as without a pin
    assert pane.figure.layout.title.text.endswith(
        "<sub>pinned: the setting shown</sub><br><sub>pin not drawn: this chart has no data</sub>")


def test_an_export_after_a_pin_holds_the_pinned_series_and_setting(dash):
    label = dash.pin()
    dash.controls["paged_cache"]["num_requests"].value = 100
    paths = dash.export(folder="out")
    csv = {p.name: p.read_text() for p in paths if p.suffix == ".csv"}
    memory = csv["paged_cache-memory.csv"]
    assert "# pinned: num_requests=256" in memory.splitlines()
    rows = [line.split(",")[0] for line in memory.splitlines() if not line.startswith("#")]
    assert rows.count("pinned: paged reserved") == 1 and rows.count("paged reserved") == 1
    assert "pinned setting" not in rows  # the legend entry holds no data
    assert "pin not drawn: this chart is a heatmap" in csv["paged_cache-block_table.csv"]
    report = paths[-1].read_text()
    assert f"<th>pinned setting</th><td>{html.escape(label)}</td>" in report
    assert report.count('"name":"pinned: paged reserved"') == 1


def test_pin_refuses_a_tab_key_no_tab_has(dash):
    with pytest.raises(ValueError, match=re.escape(
            "tab_key='kv': must be one of ['paged_cache', 'decode_kernels', 'kvpr', 'l2', "
            "'e2e']")):
        dash.pin("kv")
    with pytest.raises(ValueError, match="tab_key='kv'"):
        dash.unpin("kv")


def test_every_pinned_chart_can_be_sent_to_the_browser(dash):
    for tab in dash.tabs:
        dash.pin(tab.key)
    for tab, figures in dash.figures.items():
        for name, pane in figures.items():
            (output,) = pane.outputs
            assert "pinned: " in output["data"][PLOTLY_MIME]["layout"]["title"]["text"]
            assert non_finite_paths(output["data"][PLOTLY_MIME]) == [], (tab, name)
            json.dumps(pane.outputs, allow_nan=False)
