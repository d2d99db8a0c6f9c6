"""Widget helpers every dashboard tab uses: a labelled control, a grid of controls that wraps to
the tab's width, and charts (`FigurePane`) that the front end's Plotly renderer draws, sized by
their container, replaced whole on every change, each with an optional pinned reference (`Pin`:
the chart at another setting, drawn beside the live one by kvlab.viz.pinned.pinned_figure)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from kvlab.checks import check_int, check_real
from kvlab.device import local_gpu
from kvlab.gpus import GPUS, REFERENCE
from kvlab.viz.pinned import pinned_figure

__all__ = ["CONTROL_MIN_WIDTH", "FigurePane", "Pin", "control_grid", "figure_widget",
           "gpu_control", "gpu_here", "labeled", "modelled_for", "show_figure"]
PLOTLY_MIME = "application/vnd.plotly.v1+json"

DESCRIPTION_WIDTH = "150px"
# A control's narrowest cell: the description, a slider track and its readout, all readable.
CONTROL_MIN_WIDTH = "340px"


@dataclass(frozen=True)
class Pin:
    """A reference a `FigurePane` draws beside its live figure: `figure`, the pane's live figure
    when pinned; `label`, the setting that made it (e.g. "block_size=16, batch=8"); and
    `differs`, where given, called on every draw for what of that setting differs from the live
    one ("block_size=16"; "" where nothing does)."""

    label: str
    figure: go.Figure
    differs: Callable[[], str] | None = None

    def caption(self) -> str:
        """What a chart's subtitle names: what of the pinned setting differs from the live one
        ("the setting shown" where nothing does), or without `differs`, the whole `label`."""
        if self.differs is None:
            return self.label
        return self.differs() or "the setting shown"


class FigurePane(widgets.Output):
    """A chart in the dashboard: an ipywidgets Output showing one Plotly figure through the
    front end's Plotly renderer (the `application/vnd.plotly.v1+json` output that JupyterLab,
    Notebook and VS Code draw), replaced whole by `show_figure`.

    Unlike a `go.FigureWidget`, the figure lives in the widget's synced state (`outputs`), so a
    page reload draws it again; the renderer fits it to its container's width, at the figure's
    height, whenever it is shown or resized (a tab shown, the window or a sidebar resized); and it
    needs no FigureWidget machinery (seconds of imports).
    (`layout` is the widget's own ipywidgets Layout, as on every widget.)

    live: the go.Figure last given to `show_figure`. pinned: a `Pin` or None. figure: the
    go.Figure shown: `live`, or with a pin, `pinned_figure(live, pinned.figure,
    pinned.caption())`."""

    def __init__(self, height: int):
        super().__init__(layout=widgets.Layout(width="100%", min_height=f"{height}px"))
        self.figure = self.live = go.Figure(layout=dict(height=height, autosize=True))
        self.pinned: Pin | None = None

    def pin(self, label: str, differs: Callable[[], str] | None = None) -> None:
        """Keep the live figure as a reference described by `label` (the setting that made it),
        replacing any earlier one, and draw it beside the live figure, now and on every
        `show_figure`, until `unpin`; the subtitle names `Pin.caption()` (`differs`: see `Pin`).
        Raises ValueError for a `label` that is not a non-empty str (the pin left as it was)."""
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"label={label!r}: must be a non-empty str")
        self.pinned = Pin(label, go.Figure(self.live), differs)
        show_figure(self, self.live)

    def unpin(self) -> None:
        """Drop the pinned reference and show the live figure alone."""
        self.pinned = None
        show_figure(self, self.live)


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
        # (label, value) pairs offer their values
        options = [o[1] if isinstance(o, tuple) else o for o in kwargs["options"]]
        if type(value).__name__ in ("bool", "bool_") or value not in options:
            raise ValueError(f"{name}={value!r}: must be one of {options}")
    elif issubclass(cls, widgets.IntSlider | widgets.BoundedIntText):
        check_int(name, value, kwargs["min"], kwargs["max"])
    else:
        check_real(name, value, kwargs["min"], kwargs["max"])


def gpu_here() -> str:
    """The GPU selector's entry for the GPU in use: its key where kvlab.gpus holds it
    (kvlab.device.local_gpu), else the reference's, whose recordings the lab holds (what a tab
    measures there still says "measured on <its name>")."""
    here = local_gpu()
    return REFERENCE if here is None else here.key


def gpu_control(value: str | None = None) -> widgets.Dropdown:
    """The GPU selector every tab shows: the GPUs of kvlab.gpus.GPUS by name, valued by key.
    `value` (a key) defaults to `gpu_here()`. ValueError naming gpu for a key not in the
    table."""
    value = gpu_here() if value is None else value
    return labeled(widgets.Dropdown, "GPU", name="gpu",
                   options=[(g.name, key) for key, g in GPUS.items()], value=value)


def modelled_for(key: str) -> str:
    """How a tab labels numbers for GPU `key` that it did not measure or record there:
    "modelled for <GPU's name>"."""
    return f"modelled for {GPUS[key].name}"


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
    front end at once (nothing of the previous figure stays, and there is no blank frame), or
    none where the figure to show is the one shown (the front end would draw it again for
    nothing). Where the pane has a pin, what it shows is `fig` with the pinned figure beside it
    (kvlab.viz.pinned.pinned_figure); `fig` itself is left as it is."""
    pane.live = fig
    if pane.pinned is not None:
        fig = pinned_figure(fig, pane.pinned.figure, pane.pinned.caption())
    spec = json.loads(pio.to_json(fig, validate=False, engine="json"))
    # NOTE: not Plotly's responsive mode. It makes the figure fill its div's height, but the
    # renderer's div takes its height from the figure: unless that div was 0 px tall when first
    # drawn (in a hidden tab), the renderer's first resize collapses the figure to 0 px. The
    # renderer fits the figure to its container itself, on every show and resize.
    spec["config"] = {"responsive": False, "displaylogo": False}
    pane.figure = fig
    if pane.outputs and pane.outputs[0].get("data", {}).get(PLOTLY_MIME) == spec:
        return
    title = fig.layout.title.text or "figure"
    pane.outputs = ({"output_type": "display_data", "metadata": {},
                     "data": {PLOTLY_MIME: spec, "text/plain": f"<Plotly figure: {title}>"}},)

