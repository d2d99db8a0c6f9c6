"""Widget helpers: controls that fit a grid cell, and figures replaced wholesale (CPU)."""

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
