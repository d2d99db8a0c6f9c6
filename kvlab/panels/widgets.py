"""Widget helpers every dashboard tab uses: a labelled control, a grid of controls that wraps to
the tab's width, and charts (`FigurePane`) that the front end's Plotly renderer draws, sized by
their container, replaced whole on every change."""

from __future__ import annotations

import json

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from kvlab.checks import check_int, check_real

__all__ = ["CONTROL_MIN_WIDTH", "FigurePane", "control_grid", "figure_widget", "labeled",
           "show_figure"]
PLOTLY_MIME = "application/vnd.plotly.v1+json"

DESCRIPTION_WIDTH = "150px"
# A control's narrowest cell: the description, a slider track and its readout, all readable.
CONTROL_MIN_WIDTH = "340px"


class FigurePane(widgets.Output):
    """A chart in the dashboard: an ipywidgets Output showing one Plotly figure through the
    front end's Plotly renderer (the `application/vnd.plotly.v1+json` output that JupyterLab,
    Notebook and VS Code draw), replaced whole by `show_figure`.

    Unlike a `go.FigureWidget`, the figure lives in the widget's synced state (`outputs`), so a
    page reload draws it again; the renderer fits it to its container's width, at the figure's
    height, whenever it is shown or resized (a tab shown, the window or a sidebar resized); and it
    needs no FigureWidget machinery (seconds of imports). `figure` is the go.Figure shown.
    (`layout` is the widget's own ipywidgets Layout, as on every widget.)"""

    def __init__(self, height: int):
        super().__init__(layout=widgets.Layout(width="100%", min_height=f"{height}px"))
        self.figure = go.Figure(layout=dict(height=height, autosize=True))


def figure_widget(height: int) -> FigurePane:
    """An empty chart of a fixed height and no width (the front end sizes it to its container),
    to be filled by `show_figure`."""
    return FigurePane(height)


def labeled(cls, description: str, style: dict | None = None, name: str | None = None,
            **kwargs) -> widgets.Widget:
    """A control of type `cls` with the description column every tab uses, as wide as its cell
    in `control_grid`, and the description as its label's tooltip (or `tooltip`, where given);
    `style` adds to the description width (e.g. a ToggleButtons' button width). With `name` (the
    parameter that gave its `value`), raises ValueError naming it unless `value` is one of
    `options`, or a number in [`min`, `max`] (an integer for an integer control): where the
    control would clamp it or fail otherwise."""
    if name is not None:
        _check_value(name, cls, kwargs)
    # NOTE: ipywidgets 8.1 sets a label's title to the `tooltip` trait as is (DescriptionView.
    # updateTooltip: `label.title = model.get("tooltip")`): its default, None, shows "null" on
    # hover over the labels of sliders, number boxes and toggle buttons
    kwargs.setdefault("tooltip", description)
    return cls(
        description=description,
        style={"description_width": DESCRIPTION_WIDTH, **(style or {})},
        layout={"width": "auto", "min_width": CONTROL_MIN_WIDTH},
        **kwargs,
    )


def _check_value(name: str, cls, kwargs: dict) -> None:
    value = kwargs["value"]
    if "options" in kwargs:
        options = list(kwargs["options"])
        if type(value).__name__ in ("bool", "bool_") or value not in options:
            raise ValueError(f"{name}={value!r}: must be one of {options}")
    elif issubclass(cls, widgets.IntSlider | widgets.BoundedIntText):
        check_int(name, value, kwargs["min"], kwargs["max"])
    else:
        check_real(name, value, kwargs["min"], kwargs["max"])


def control_grid(controls: list[widgets.Widget]) -> widgets.GridBox:
    """`controls` in as many columns of at least `CONTROL_MIN_WIDTH` as the tab's width holds,
    in reading order (row by row); one column on a narrow screen."""
    return widgets.GridBox(
        controls,
        layout=widgets.Layout(
            width="100%",
            grid_template_columns=f"repeat(auto-fill, minmax({CONTROL_MIN_WIDTH}, 1fr))",
            grid_gap="2px 16px",
        ),
    )


def show_figure(pane: FigurePane, fig: go.Figure) -> None:
    """Make `pane` show `fig`, replacing what it showed: one update of its output, sent to the
    front end at once (nothing of the previous figure stays, and there is no blank frame)."""
    spec = json.loads(pio.to_json(fig, validate=False, engine="json"))
    # NOTE: not Plotly's responsive mode. It makes the figure fill its div's height, but the
    # renderer's div takes its height from the figure: unless that div was 0 px tall when first
    # drawn (in a hidden tab), the renderer's first resize collapses the figure to 0 px. The
    # renderer fits the figure to its container itself, on every show and resize.
    spec["config"] = {"responsive": False, "displaylogo": False}
    title = fig.layout.title.text or "figure"
    pane.outputs = ({"output_type": "display_data", "metadata": {},
                     "data": {PLOTLY_MIME: spec, "text/plain": f"<Plotly figure: {title}>"}},)
    pane.figure = fig
