"""The layout every kvlab figure shares: sized by its container (no fixed width), a short title,
detail and provenance lines below it (provenance on a line of its own, so it is never cut), the
legend at the bottom, below the x axis's labels and title, and a note instead of an empty or broken
chart where there is nothing to draw.

NOTE: Plotly does not wrap titles. A title line should fit a 500 px chart: about 45 characters of
the title font, about 70 of a subtitle line.
"""

from __future__ import annotations

import html
import math
import textwrap

import plotly.graph_objects as go

from kvlab.checks import check_int

__all__ = ["LEGEND_AT_BOTTOM", "LEGEND_BELOW", "check_height", "note_figure", "note_text",
           "style", "title_text", "top_margin", "unreadable_figure"]

# NOTE: the legend hangs from the figure's bottom edge ("container"), not below the plot area by a
# fraction of the plot's height: Plotly's automargin then grows the bottom margin to hold the x
# axis's tick labels and title and, below them, the legend, however many rows it wraps to at the
# chart's width. A fraction of the plot's height is a fixed offset in pixels only until the legend
# wraps: the margin grows, the plot shrinks, and the legend moves up onto the axis title with it.
LEGEND_AT_BOTTOM = dict(orientation="h", x=0.0, xanchor="left", yref="container", y=0.0,
                        yanchor="bottom")
LEGEND_BELOW = dict(orientation="h", x=0.0, xanchor="left", y=-0.22, yanchor="top")  # paper units
# The title's lines, in pixels from the top: the first line's baseline at TITLE_BASELINE_PX (its
# `pad.t`: a title of several lines is drawn from its first baseline down), each next one
# TITLE_LINE_PX lower (the 17 px title font x Plotly's line spacing, 1.3), and the plot
# TITLE_GAP_PX below the last one.
# NOTE: the top margin is computed here, and the title has no automargin. A title's automargin
# pushes the margin after the bars and lines were drawn, and only the axes follow them
# (plotly.js #7750: the data lands some 20 px off its axes, over the subplot titles); without the
# push, Plotly 4.1 draws a title of several lines anchored at its bottom from its first line
# down, into the plot.
TITLE_BASELINE_PX, TITLE_LINE_PX, TITLE_GAP_PX = 26, 22.1, 26
NOTE_LINE_CHARS = 72  # of a note's line, where it is wrapped here
MIN_HEIGHT_PX, MAX_HEIGHT_PX = 10, 100_000  # of a figure: Plotly's least, and past any chart


def _subtitle_lines(provenance: str, details) -> list[str]:
    return [line for d in details if d for line in d.split("<br>")] + provenance.split("<br>")


def top_margin(num_lines: int) -> int:
    """The top margin (px) that holds a title of `num_lines` lines (the title and its subtitle
    lines) and the gap below them."""
    return math.ceil(TITLE_BASELINE_PX + TITLE_LINE_PX * (num_lines - 1) + TITLE_GAP_PX)


def title_text(title: str, provenance: str, *details: str) -> str:
    """`title`, then each non-empty detail line, then `provenance` (one line, or several split
    by "<br>"), as subtitle lines."""
    lines = _subtitle_lines(provenance, details)
    return "<br>".join([title, *(f"<sub>{line}</sub>" for line in lines)])


def style(
    fig: go.Figure,
    title: str,
    provenance: str,
    *details: str,
    height: int,
    legend_y: float | None = None,
) -> go.Figure:
    """Give `fig` the shared layout: `title_text(title, provenance, *details)` at the top left
    with a top margin that holds its lines (`top_margin`), autosize with `height` (px) and no
    width, and the legend, horizontal: at the figure's bottom edge, below the x axis's labels and
    title (`LEGEND_AT_BOTTOM`), or with `legend_y` (paper units, < 0) that far below the plot area.
    Returns `fig`. Raises ValueError for a `height` that is not an integer in
    [MIN_HEIGHT_PX, MAX_HEIGHT_PX]."""
    check_height(height)
    num_sub = len(_subtitle_lines(provenance, details))
    legend = LEGEND_AT_BOTTOM if legend_y is None else {**LEGEND_BELOW, "y": legend_y}
    fig.update_layout(
        title=dict(
            text=title_text(title, provenance, *details),
            x=0.0,
            xref="container",
            xanchor="left",
            y=1.0,
            yref="container",
            yanchor="top",
            automargin=False,
            pad=dict(t=TITLE_BASELINE_PX, l=12),
        ),
        autosize=True,
        height=int(height),
        legend=legend,
        margin=dict(t=top_margin(1 + num_sub), r=20),
    )
    return fig


def check_height(height) -> None:
    """ValueError unless `height` (px) is an integer in [MIN_HEIGHT_PX, MAX_HEIGHT_PX]."""
    check_int("height", height, MIN_HEIGHT_PX, MAX_HEIGHT_PX)


def note_figure(title: str, provenance: str, note: str, height: int) -> go.Figure:
    """A figure with nothing to draw: `title` and `provenance` as `style` gives them, and `note`
    (e.g. what to run to record the data) in the middle of an axis-free plot area."""
    fig = go.Figure()
    fig.add_annotation(
        text=note, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
        font=dict(size=13, color="#555"),
    )
    fig.update_layout(xaxis_visible=False, yaxis_visible=False, plot_bgcolor="white")
    return style(fig, title, provenance, height=height)


def note_text(text: str) -> str:
    """`text` as a note's lines: HTML-escaped, wrapped at NOTE_LINE_CHARS (a 500 px chart's
    width), joined by <br>."""
    return "<br>".join(html.escape(line) for line in textwrap.wrap(text, NOTE_LINE_CHARS))


def unreadable_figure(title: str, why: str, height: int) -> go.Figure:
    """`note_figure` where a recording could not be read: `why`, "<file>: <reason>" (the message
    of `kvlab.results`' ValueError), the file on lines of its own above the reason."""
    where, _, reason = why.partition(": ")
    return note_figure(title, "recording unreadable", f"unreadable recording:<br>"
                       f"{note_text(where)}<br>{note_text(reason)}", height)
