"""The layout every figure shares (CPU): a top margin that holds the title's lines, so that Plotly
never pushes it (and the data never lands off its axes), and the legend at the figure's bottom
edge, below the x axis's labels and title, at any height."""

import plotly.graph_objects as go
import pytest

from kvlab.viz.layout import LEGEND_AT_BOTTOM, note_figure, style, title_text, top_margin

# The top margin Plotly 4.1.1's title automargin asked for, title and n subtitle lines of kvlab's
# titles, measured in Chromium: 54 + 22 n px (1 to 5 lines)
PLOTLY_TOP_PX = {1: 76, 2: 98, 3: 120, 4: 142, 5: 164}


def figure(*details, provenance="recorded on X", height=360, **kwargs):
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="a"))
    return style(fig, "Title", provenance, *details, height=height, **kwargs)


@pytest.mark.parametrize("num_sub", sorted(PLOTLY_TOP_PX))
def test_the_top_margin_holds_every_title_line(num_sub):
    fig = figure(*(f"detail {i}" for i in range(num_sub - 1)))
    assert fig.layout.title.text.count("<br>") == num_sub
    # within 3 px of what Plotly would push it to: the gap below the title stays as it was
    assert abs(fig.layout.margin.t - PLOTLY_TOP_PX[num_sub]) <= 3
    assert fig.layout.margin.t == top_margin(1 + num_sub)
    # drawn from the top down, with no automargin: Plotly never moves the margin after the data
    assert (fig.layout.title.yref, fig.layout.title.yanchor, fig.layout.title.y) == (
        "container", "top", 1.0)
    assert fig.layout.title.automargin is False


def test_lines_split_by_br_count_as_lines():
    two = figure("a<br>b", provenance="recorded<br>on X")
    assert two.layout.title.text == title_text("Title", "recorded<br>on X", "a<br>b")
    assert two.layout.title.text.count("<sub>") == 4
    assert two.layout.margin.t == top_margin(5)


@pytest.mark.parametrize("height", [260, 360, 420, 620])
def test_the_legend_hangs_from_the_bottom_edge_at_every_height(height):
    """Plotly's automargin then holds the x axis's tick labels and title, and the legend below
    them, however many rows the legend wraps to. A paper offset below the plot (the old
    y=-0.22) is a fraction of the plot's height: 35 px at 360 px, on the axis title."""
    legend = figure(height=height).layout.legend
    assert (legend.yref, legend.y, legend.yanchor, legend.orientation) == (
        "container", 0.0, "bottom", "h")
    assert figure(height=height).layout.margin.b is None  # Plotly's, grown to hold both


def test_a_legend_y_in_paper_units_still_places_it_below_the_plot():
    legend = figure(legend_y=-0.4).layout.legend
    assert (legend.yref, legend.y, legend.yanchor) in ((None, -0.4, "top"), ("paper", -0.4, "top"))
    assert LEGEND_AT_BOTTOM["yref"] == "container"


def test_a_note_figure_has_the_same_title_block():
    fig = note_figure("Title", "not recorded", "run this", 360)
    assert fig.layout.margin.t == top_margin(2) and fig.layout.title.automargin is False
