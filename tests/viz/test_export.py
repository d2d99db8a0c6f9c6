"""Exports: a chart's data as a long-format table and CSV, and a self-contained HTML report
(CPU)."""

import numpy as np
import plotly.graph_objects as go

from kvlab.viz.export import figure_csv, figure_table, html_report


def test_bars_and_heatmaps_flatten_to_one_row_per_point():
    fig = go.Figure([go.Bar(name="gqa", x=["a", "b"], y=[1.5, 2.5], text=["<b>x</b>", "y"]),
                     go.Heatmap(name="tables", z=np.array([[0, np.nan], [2, 3]]), x=[10, 20])])
    table = figure_table(fig)
    bars = table[table.trace == "gqa"]
    assert bars[["x", "y", "text"]].values.tolist() == [["a", 1.5, "x"], ["b", 2.5, "y"]]
    heat = table[table.trace == "tables"]
    assert heat[["x", "y", "z"]].values.tolist()[0] == [10, 0, 0.0]
    assert heat["z"].isna().tolist() == [False, True, False, False]  # the gap: an empty cell
    assert heat["x"].tolist() == [10, 20, 10, 20] and heat["y"].tolist() == [0, 0, 1, 1]


def test_csv_is_headed_by_the_title_and_its_provenance():
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout=dict(
        title="Split<br><sub>recorded on NVIDIA H200, 2026-12-01</sub>"))
    lines = figure_csv(fig).splitlines()
    assert lines[:3] == ["# Split", "# recorded on NVIDIA H200, 2026-12-01", "trace,type,x,y"]
    assert lines[3] == "trace 0,scatter,1,3"


def test_report_holds_plotly_once_the_settings_and_every_figure():
    figs = {"one": go.Figure(go.Bar(y=[1])), "two": go.Figure(go.Bar(y=[2]))}
    page = html_report("kvlab: Paged cache", "sim: recorded", {"block_size": 16}, figs)
    assert page.count("<h2>") == 2 and "<td>16</td>" in page
    assert page.count("Plotly.newPlot") == 2
    assert page.count("plotly.js v") == 1  # the library inside the page, once: no network


def test_csv_columns_carry_each_axis_title_and_its_units():
    fig = go.Figure([go.Scatter(name="paged", x=[1, 2], y=[0.5, 0.25]),
                     go.Scatter(name="reserved", x=[1, 2], y=[30, 31], yaxis="y2")],
                    layout=dict(xaxis_title="block_size (tokens)",
                                yaxis_title="internal fragmentation (%)",
                                yaxis2=dict(title="paged reserved<br>(GiB)", overlaying="y")))
    header = figure_csv(fig).splitlines()[0]
    assert header == ("trace,type,x: block_size (tokens),y: internal fragmentation (%),"
                      "y: paged reserved (GiB)")
    reserved = figure_table(fig)["y: paged reserved (GiB)"]  # a column of its own
    assert reserved.isna().tolist() == [True, True, False, False]
    assert reserved.tolist()[2:] == [30, 31]


def test_an_axis_of_subplots_takes_the_title_of_the_axis_it_matches():
    fig = go.Figure([go.Scatter(x=[1], y=[2]), go.Scatter(x=[3], y=[4], xaxis="x2", yaxis="y2")],
                    layout=dict(xaxis=dict(matches="x2", domain=[0, 1]),
                                xaxis2=dict(title="us after the launch", anchor="y2"),
                                yaxis=dict(title="SM", domain=[0.5, 1]),
                                yaxis2=dict(title="SM", domain=[0, 0.4], anchor="x2")))
    assert list(figure_table(fig).columns) == ["trace", "type", "x: us after the launch", "y: SM"]


def test_a_heatmap_names_its_values_by_its_colorbar_or_its_coloraxis():
    own = go.Figure(go.Heatmap(z=[[1, 2]], colorbar=dict(title="physical<br>block id")),
                    layout=dict(xaxis_title="logical block", yaxis_title="request"))
    assert list(figure_table(own).columns) == [
        "trace", "type", "x: logical block", "y: request", "z: physical block id"]
    shared = go.Figure(go.Heatmap(z=[[1.2]], coloraxis="coloraxis"),
                       layout=dict(coloraxis=dict(colorbar=dict(title=dict(text="speedup")))))
    assert list(figure_table(shared).columns)[-1] == "z: speedup"


def test_a_timeline_bar_gives_where_it_starts_and_ends_on_its_axis():
    fig = go.Figure([go.Bar(name="KV", orientation="h", x=[2.5, 1.0], base=[10.0, 20.0],
                            y=["H2D", "H2D"]),
                     go.Bar(name="X", orientation="h", x=[4.0], base=3.0, y=["compute"])],
                    layout=dict(xaxis_title="time (us)"))
    table = figure_table(fig)
    assert list(table.columns) == ["trace", "type", "x start: time (us)", "x end: time (us)", "y"]
    assert table.values.tolist() == [["KV", "bar", 10.0, 12.5, "H2D"],
                                     ["KV", "bar", 20.0, 21.0, "H2D"],
                                     ["X", "bar", 3.0, 7.0, "compute"]]
    vertical = figure_table(go.Figure(go.Bar(x=["a"], y=[2.0], base=[1.0])))
    assert vertical[["y start", "y end"]].values.tolist() == [[1.0, 3.0]]


def test_report_needs_no_network_and_draws_each_figure_again_on_its_axes():
    page = html_report("kvlab", "sim", {}, {"one": go.Figure(go.Bar(y=[1])),
                                            "two": go.Figure(go.Bar(y=[2]))})
    assert "<script src" not in page and "<link" not in page  # plotly.js inline; no CDN
    # the second draw that puts the data where the axes are (plotly.js issue #7750)
    assert page.count("Plotly.redraw(") == 2


def test_a_point_with_neither_x_nor_y_gives_no_row():
    """A legend entry's [None] (a pinned chart's "pinned setting", a kernel's colour) and the gaps
    between a line's segments (a CTA timeline) hold no data."""
    fig = go.Figure([go.Scatter(name="key", x=[None], y=[None]),
                     go.Scatter(name="segments", x=[0, 1, None, 2], y=[5, 5, None, 6]),
                     go.Scatter(name="a gap in y", x=[1, 2], y=[None, 3])])
    table = figure_table(fig)
    assert table.trace.tolist() == ["segments"] * 3 + ["a gap in y"] * 2
    assert table.x.tolist() == [0, 1, 2, 1, 2]
