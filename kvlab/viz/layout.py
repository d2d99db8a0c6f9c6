"""The layout every kvlab figure shares: sized by its container (no fixed width), a short title,
detail and provenance lines below it (provenance on a line of its own, so it is never cut), the
legend below the plot, and a note instead of an empty or broken chart where there is nothing to
draw.

NOTE: Plotly does not wrap titles. A title line should fit a 500 px chart: about 45 characters of
the title font, about 70 of a subtitle line.
"""

from __future__ import annotations

import html
import textwrap

import plotly.graph_objects as go

from kvlab.checks import check_int

__all__ = ["LEGEND_BELOW", "check_height", "note_figure", "style", "title_text",
           "unreadable_figure"]

LEGEND_BELOW = dict(orientation="h", x=0.0, xanchor="left", y=-0.22, yanchor="top")
TITLE_LINE_PX, SUBTITLE_LINE_PX = 30, 20  # top margin each title / subtitle line takes
NOTE_LINE_CHARS = 72  # of a note's line, where it is wrapped here
MIN_HEIGHT_PX, MAX_HEIGHT_PX = 10, 100_000  # of a figure: Plotly's least, and past any chart


def _subtitle_lines(provenance: str, details) -> list[str]:
    return [d for d in details if d] + provenance.split("<br>")


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
    legend_y: float = LEGEND_BELOW["y"],
) -> go.Figure:
    """Give `fig` the shared layout: `title_text(title, provenance, *details)` at the top left
    with a top margin that fits its lines, autosize with `height` (px) and no width, the legend
    below the plot area at `legend_y` (paper units, < 0). Returns `fig`. Raises ValueError for a
    `height` that is not an integer in [MIN_HEIGHT_PX, MAX_HEIGHT_PX]."""
    check_height(height)
    num_sub = len(_subtitle_lines(provenance, details))
    fig.update_layout(
        title=dict(
            text=title_text(title, provenance, *details),
            x=0.0,
            xref="container",
            xanchor="left",
            y=1.0,
            yref="paper",
            yanchor="bottom",
            automargin=True,  # the top margin grows to hold every line
            pad=dict(b=20, l=12),
        ),
        autosize=True,
        height=int(height),
        legend={**LEGEND_BELOW, "y": legend_y},
        margin=dict(t=TITLE_LINE_PX + 8 + SUBTITLE_LINE_PX * num_sub, r=20),
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


def unreadable_figure(title: str, why: str, height: int) -> go.Figure:
    """`note_figure` where a recording could not be read: `why`, "<file>: <reason>" (the message
    of `kvlab.results`' ValueError), the file on lines of its own above the reason."""
    where, _, reason = why.partition(": ")
    lines = [*textwrap.wrap(where, NOTE_LINE_CHARS), *textwrap.wrap(reason, NOTE_LINE_CHARS)]
    return note_figure(title, "recording unreadable", "unreadable recording:<br>"
                       + "<br>".join(html.escape(line) for line in lines), height)
