"""Widget helpers: controls that fit a grid cell, figures replaced wholesale, and a pinned
figure drawn beside the live one (CPU)."""

import re

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest
from plotly.subplots import make_subplots

from kvlab.panels.widgets import (
    CONTROL_MIN_WIDTH,
    PLOTLY_MIME,
    control_grid,
    figure_widget,
    labeled,
    show_figure,
)
from kvlab.viz.layout import note_figure, style


def test_show_figure_replaces_the_whole_output_with_the_new_figure():
    pane = figure_widget(300)
    assert pane.outputs == ()
    two = make_subplots(rows=1, cols=2, subplot_titles=("left", "right"))
    two.add_trace(go.Bar(y=[1]), row=1, col=1).add_trace(go.Bar(y=[2]), row=1, col=2)
    two.add_hline(y=1)
    show_figure(pane, two)
    (output,) = pane.outputs
    spec = output["data"][PLOTLY_MIME]
    assert [a["text"] for a in spec["layout"]["annotations"]] == ["left", "right"]
    assert spec["config"]["responsive"] is False and pane.figure is two
    show_figure(pane, go.Figure(layout=dict(height=300, title="empty")))
    (output,) = pane.outputs  # one output: nothing of the previous figure is left to merge
    layout = output["data"][PLOTLY_MIME]["layout"]
    assert "annotations" not in layout and "shapes" not in layout and "xaxis2" not in layout
    assert output["data"][PLOTLY_MIME]["data"] == [] and layout["title"]["text"] == "empty"
    assert output["data"]["text/plain"] == "<Plotly figure: empty>"


def test_show_figure_sends_nothing_where_the_figure_is_the_one_shown():
    pane = figure_widget(300)
    sent = []
    pane.observe(lambda change: sent.append(change["new"]), names="outputs")
    show_figure(pane, go.Figure(go.Bar(y=[1, 2])))
    # as the front end syncs it back: the PNG it made beside the figure, and lists for tuples
    pane.outputs = [{**pane.outputs[0], "data": {**pane.outputs[0]["data"], "image/png": "AA=="}}]
    sent.clear()
    same = go.Figure(go.Bar(y=[1, 2]))
    show_figure(pane, same)
    assert sent == [] and pane.figure is same and pane.live is same
    show_figure(pane, go.Figure(go.Bar(y=[1, 3])))
    assert len(sent) == 1 and sent[0][0]["data"][PLOTLY_MIME]["data"][0]["y"] == [1, 3]


def test_figures_have_no_width_and_controls_fill_a_wrapping_grid():
    pane = figure_widget(300)
    assert pane.figure.layout.width is None and pane.figure.layout.autosize
    assert pane.layout.width == "100%"  # the widget spans its container
    slider = labeled(widgets.IntSlider, "num requests", min=1, max=1000)
    assert slider.layout.width == "auto" and slider.layout.min_width == CONTROL_MIN_WIDTH
    toggle = labeled(widgets.ToggleButtons, "rates", options=["a", "b"],
                     style={"button_width": "84px"})
    assert toggle.style.button_width == "84px" and toggle.style.description_width == "150px"
    grid = control_grid([slider, toggle])
    assert "auto-fill" in grid.layout.grid_template_columns and grid.layout.width == "100%"


@pytest.mark.parametrize("cls, kwargs", [
    (widgets.IntSlider, {"min": 1, "max": 9}), (widgets.FloatSlider, {"min": 0.0, "max": 1.0}),
    (widgets.BoundedIntText, {"min": 1, "max": 9}), (widgets.ToggleButtons, {"options": ["a"]}),
    (widgets.Dropdown, {"options": ["a"]})])
def test_a_labels_tooltip_is_its_description_not_null(cls, kwargs):
    """ipywidgets 8.1 writes the `tooltip` trait into the label's title as is: None showed
    "null" on hover (seen in Chromium over "batch", "split l (tokens)", ...)."""
    assert labeled(cls, "batch", **kwargs).tooltip == "batch"
    assert labeled(cls, "batch", tooltip="sequences decoded together", **kwargs).tooltip == (
        "sequences decoded together")



# A pinned setting drawn beside the live one (kvlab.viz.pinned draws it: tests/viz/test_pinned.py).

def bars(scale: float) -> go.Figure:
    return style(go.Figure(go.Bar(name="reserved", x=["paged", "contiguous"], y=[scale, 2 * scale]),
                           layout=dict(yaxis_title="GiB")), "KV memory", "computed", height=420)


def test_a_pane_with_a_pin_shows_the_live_and_the_pinned_traces():
    pane = figure_widget(420)
    show_figure(pane, bars(1.0))
    pane.pin("scale=1")
    assert [t.name for t in pane.figure.data[:2]] == ["reserved", "pinned: reserved"]  # at once
    live = bars(3.0)
    show_figure(pane, live)
    assert pane.live is live and len(live.data) == 1  # the live figure is left as it is
    assert [(t.name, list(t.y)) for t in pane.figure.data[:2]] == [
        ("reserved", [3.0, 6.0]), ("pinned: reserved", [1.0, 2.0])]
    assert pane.figure.layout.title.text.endswith("<sub>pinned: scale=1</sub>")
    assert pane.figure.layout.height == 420
    (output,) = pane.outputs  # what the browser gets is the figure with the pin
    assert [t["name"] for t in output["data"][PLOTLY_MIME]["data"]][:2] == [
        "reserved", "pinned: reserved"]


def test_unpin_shows_the_live_figure_alone_and_pinning_again_replaces_the_pin():
    pane = figure_widget(420)
    show_figure(pane, bars(1.0))
    pane.pin("scale=1")
    show_figure(pane, bars(2.0))
    pane.pin("scale=2")  # pins the live figure, not the one shown with the old pin
    pinned = [t for t in pane.figure.data if t.name == "pinned: reserved"]
    assert [list(t.y) for t in pinned] == [[2.0, 4.0]]
    assert "pinned: scale=2" in pane.figure.layout.title.text
    assert "scale=1" not in pane.figure.layout.title.text
    live = bars(3.0)
    show_figure(pane, live)
    pane.unpin()
    assert pane.pinned is None and pane.figure is live
    (output,) = pane.outputs
    assert len(output["data"][PLOTLY_MIME]["data"]) == 1


@pytest.mark.parametrize("label", ["", "  ", None, 3])
def test_a_pin_needs_a_label_naming_it(label):
    pane = figure_widget(300)
    with pytest.raises(ValueError, match=re.escape(f"label={label!r}: must be a non-empty str")):
        pane.pin(label)
    assert pane.pinned is None


def test_the_subtitle_names_what_differs_from_the_live_setting_where_the_pin_says():
    pane = figure_widget(420)
    show_figure(pane, bars(1.0))
    differs = ["block_size=16"]
    pane.pin("model=llama3-8b, block_size=16", lambda: differs[0])
    assert pane.figure.layout.title.text.endswith("<sub>pinned: block_size=16</sub>")
    differs[0] = ""
    show_figure(pane, bars(1.0))
    assert pane.figure.layout.title.text.endswith("<sub>pinned: the setting shown</sub>")
    assert pane.pinned.label == "model=llama3-8b, block_size=16"


def test_a_note_under_a_pin_is_drawn_and_says_the_pin_is_not():
    pane = figure_widget(360)
    show_figure(pane, bars(1.0))
    pane.pin("block_size=16")
    note = note_figure("KV memory", "not recorded", "nothing to draw", 360)
    show_figure(pane, note)
    assert not pane.figure.data and pane.figure.layout.annotations == note.layout.annotations
    assert pane.figure.layout.title.text.endswith(
        "<sub>pinned: block_size=16</sub><br><sub>pin not drawn: this chart has no data</sub>")
