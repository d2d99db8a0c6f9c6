"""Widget helpers every dashboard tab uses: a labelled control, and Plotly figures shown as live
`FigureWidget`s that update in place."""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go

__all__ = ["figure_widget", "labeled", "show_figure"]


def figure_widget(height: int) -> go.FigureWidget:
    """An empty `go.FigureWidget` of a fixed height, to be filled by `show_figure`."""
    return go.FigureWidget(layout=dict(height=height))


def labeled(cls, description: str, **kwargs) -> widgets.Widget:
    """A control of type `cls` with the description column and width every tab uses."""
    return cls(
        description=description,
        style={"description_width": "150px"},
        layout={"width": "420px"},
        **kwargs,
    )


def show_figure(widget: go.FigureWidget, fig: go.Figure) -> None:
    """Make `widget` show `fig`: traces and layout replaced in one `batch_update`.

    Traces are updated in place when `fig` has the same trace types as the widget (the front end
    then redraws without rebuilding), else replaced.
    """
    same_traces = [t.type for t in widget.data] == [t.type for t in fig.data]
    with widget.batch_update():
        if same_traces:
            for old, new in zip(widget.data, fig.data, strict=True):
                props = new.to_plotly_json()
                props.pop("type")
                old.update(props, overwrite=True)
        else:
            widget.data = ()
            widget.add_traces(fig.data)
        widget.layout = fig.layout
