"""A chart at a pinned setting drawn beside the same chart at the live one: the pinned series
dimmed, in their own legend group, bars in slots of their own; or, where the charts compare no
series with series (a note, a heatmap, a timeline, another chart), the live chart alone, saying
so. The dashboard's "Pin this setting" shows every chart of a tab so (kvlab.panels.widgets.Pin).
"""

from __future__ import annotations

import html
import re
import textwrap

import numpy as np
import plotly.graph_objects as go
from plotly.colors import DEFAULT_PLOTLY_COLORS

from kvlab.viz.layout import top_margin

__all__ = ["PIN_DASH", "PIN_GROUP", "PIN_OPACITY", "pinned_figure"]

PIN_GROUP = "pinned"  # the legend group of a pinned chart's traces: one legend entry shows it
PIN_OPACITY = 0.35  # of a pinned trace
PIN_DASH = "dot"  # of a pinned line
PIN_LINE_CHARS = 70  # of a subtitle line naming the pin (kvlab.viz.layout: ~70 fit 500 px)
_AXIS_KEY = re.compile(r"[xy]axis\d*")  # a layout key naming an axis: "xaxis", "yaxis2", ...


def pinned_figure(live: go.Figure, pinned: go.Figure, label: str) -> go.Figure:
    """A new figure: `live` with the traces of `pinned` (the same chart at the setting `label`)
    drawn beside its own, and the subtitle line "pinned: <label>"; `live` and `pinned` are left
    as they are, and so is the height.

    Each pinned trace holding data is a copy named "pinned: <its name>" (its hover text too), in
    its colour at PIN_OPACITY, a line dotted (PIN_DASH), in the legend group PIN_GROUP, which one
    legend entry, "pinned setting", shows and hides. Bars sit beside the live ones, never on
    them: in "group" mode each pinned bar in a slot of its own (offsetgroup "pinned: <group>"
    where its twin has one); in the other modes (overlay, stack, relative) the live bars overlay
    or stack as before in their offsetgroups ("live" where they had none), and the pinned bars
    likewise in theirs ("pinned: <group>", "pinned") beside them. An axis whose range both
    charts fix takes the range that holds both.

    Where the charts do not compare series with series: no data (a note), a trace other than
    bars and lines (a heatmap), a timeline (bars from a `base`, lines of segments), or other
    axes or bar mode at the pinned setting (another chart in the same pane), the figure is
    `live` with the lines "pinned: <label>" and "pin not drawn: <why>"."""
    fig = go.Figure(live)
    mine, theirs = _not_comparable(live), _not_comparable(pinned) or _other_chart(live, pinned)
    why = f"this chart {mine}" if mine else f"the pinned chart {theirs}" if theirs else None
    if why is not None:
        return _add_subtitle(fig, f"pinned: {label}", f"pin not drawn: {why}")
    barmode = live.layout.barmode or "group"
    if barmode != "group":
        fig.update_traces(selector=lambda t: t.type == "bar" and t.offsetgroup is None,
                          offsetgroup="live")
    colorway = (pinned.layout.colorway or pinned.layout.template.layout.colorway
                or DEFAULT_PLOTLY_COLORS)
    copies = [_pinned_trace(trace, i, colorway[i % len(colorway)], barmode)
              for i, trace in enumerate(pinned.data) if _drawn(trace)]
    bars = any(t.type == "bar" for t in copies)
    key = go.Scatter(name="pinned setting", x=[None], y=[None], legendgroup=PIN_GROUP,
                     opacity=PIN_OPACITY, mode="markers" if bars else "lines",
                     marker=dict(symbol="square", size=12, color="gray"),
                     line=dict(color="gray", dash=PIN_DASH), hoverinfo="skip")
    fig.add_traces([*copies, key])
    _hold_both_ranges(fig, pinned)
    return _add_subtitle(fig, f"pinned: {label}")


def _pinned_trace(trace, index: int, color: str, barmode: str):
    """The copy of `trace` (the `index`-th of its figure, drawn in `color` where it sets none)
    that `pinned_figure` draws."""
    copy = type(trace)(trace)
    copy.update(name=f"pinned: {trace.name or f'trace {index}'}", legendgroup=PIN_GROUP,
                showlegend=False, opacity=PIN_OPACITY)
    if isinstance(trace.hovertemplate, str):
        copy.hovertemplate = f"pinned: {trace.hovertemplate}"
    if trace.type == "bar":
        if trace.marker.color is None:
            copy.marker.color = color
        group = trace.offsetgroup
        copy.offsetgroup = (f"pinned: {group}" if group else
                             None if barmode == "group" else "pinned")
    else:
        # NOTE: Plotly colours a line by its marker's colour where that is one colour
        if trace.line.color is None and not isinstance(trace.marker.color, str):
            copy.line.color = color
        copy.line.dash = PIN_DASH
    return copy


def _values(trace, key: str) -> list:
    """The values of `trace`'s `key` ("x", "z", ...), flattened; [] where it has none."""
    value = trace[key] if key in trace else None
    return [] if value is None else list(np.ravel(np.asarray(value, dtype=object)))


def _drawn(trace) -> bool:
    """Whether `trace` draws a point: visible, and a value in x, y or z (not a legend entry's
    [None])."""
    return trace.visible in (None, True) and any(
        v is not None for key in ("x", "y", "z") for v in _values(trace, key))


def _not_comparable(fig: go.Figure) -> str | None:
    """Why `fig`'s traces are no series to draw another's beside ("is a heatmap"), or None
    where they are."""
    drawn = [t for t in fig.data if _drawn(t)]
    if not drawn:
        return "has no data"
    for trace in drawn:
        if trace.type not in ("bar", "scatter"):
            return f"is a {trace.type}"
        if (trace.base is not None if trace.type == "bar" else None in _values(trace, "x")):
            return "is a timeline"
    return None


def _axes(fig: go.Figure) -> dict[str, str | None]:
    """{axis ("xaxis", "yaxis2", ...): its title} of `fig`."""
    layout = fig.layout.to_plotly_json()
    return {key: (axis.get("title") or {}).get("text") for key, axis in layout.items()
            if _AXIS_KEY.fullmatch(key)}


def _other_chart(live: go.Figure, pinned: go.Figure) -> str | None:
    """Why `pinned` is another chart than `live` (not the same axes, titled alike, and bar
    mode: "has other axes"), or None."""
    if _axes(live) != _axes(pinned):
        return "has other axes"
    if (live.layout.barmode or "group") != (pinned.layout.barmode or "group"):
        return "has another bar mode"
    return None


def _hold_both_ranges(fig: go.Figure, pinned: go.Figure) -> None:
    """Widen each axis range `fig` and `pinned` both fix to hold both (in `fig`'s direction)."""
    theirs = pinned.layout.to_plotly_json()
    for key, axis in fig.layout.to_plotly_json().items():
        if not _AXIS_KEY.fullmatch(key):
            continue
        mine, other = axis.get("range"), (theirs.get(key) or {}).get("range")
        if not (_span(mine) and _span(other)):
            continue
        lo, hi = min(*mine, *other), max(*mine, *other)
        fig.layout[key].range = [lo, hi] if mine[0] <= mine[1] else [hi, lo]


def _span(value) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))


def _add_subtitle(fig: go.Figure, *texts: str) -> go.Figure:
    """`fig` with each of `texts` as subtitle lines (wrapped at PIN_LINE_CHARS) below its title,
    and a top margin that holds them (kvlab.viz.layout.top_margin)."""
    title = fig.layout.title.text
    lines = [f"<sub>{html.escape(line, quote=False)}</sub>"
             for text in texts for line in textwrap.wrap(text, PIN_LINE_CHARS)]
    text = "<br>".join([title, *lines] if title else lines)
    return fig.update_layout(title_text=text, margin_t=top_margin(text.count("<br>") + 1))
