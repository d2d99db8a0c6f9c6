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
