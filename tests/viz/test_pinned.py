"""A pinned chart drawn beside the live one: its series named, dimmed, grouped in the legend, its
bars never on the live ones; or the live chart alone where the two compare no series (CPU)."""

import plotly.graph_objects as go
import pytest

from kvlab.viz.layout import note_figure, style, top_margin
from kvlab.viz.pinned import PIN_DASH, PIN_GROUP, PIN_OPACITY, pinned_figure


def bars_and_line(scale: float, barmode: str = "group", orientation: str = "v") -> go.Figure:
    """A styled chart of two bar series (one in offsetgroup "reserved") and a line, at `scale`."""
    cats, values = ["paged", "contiguous"], [1.0 * scale, 2.0 * scale]
    xy = (lambda v: {"x": cats, "y": v}) if orientation == "v" else (
        lambda v: {"y": cats, "x": v})
    fig = go.Figure([
        go.Bar(name="reserved", offsetgroup="reserved", orientation=orientation, **xy(values)),
        go.Bar(name="holding", orientation=orientation, marker_color="#aec7e8", **xy(values)),
        go.Scatter(name="budget", mode="lines", hovertemplate="%{y} GiB", **xy(values)),
    ], layout=dict(barmode=barmode, xaxis_title="scheme", yaxis_title="GiB"))
    return style(fig, "KV memory", "computed", f"scale {scale}", height=420)


def test_pinned_series_are_copies_named_dimmed_in_their_colours_with_one_legend_entry():
    live, pinned = bars_and_line(3.0), bars_and_line(1.0)
    shown = pinned_figure(live, pinned, "scale=1")
    assert len(live.data) == len(pinned.data) == 3  # both left as they are
    assert list(shown.data[:3]) == list(live.data)
    copies = [t for t in shown.data if t.legendgroup == PIN_GROUP][:-1]
    assert [t.name for t in copies] == ["pinned: reserved", "pinned: holding", "pinned: budget"]
    assert [list(t.y) for t in copies] == [[1.0, 2.0]] * 3
    assert all(t.opacity == PIN_OPACITY and t.showlegend is False for t in copies)
    # bars beside the live ones: a slot of their own ("group" mode), grouped as the live ones
    assert [t.offsetgroup for t in copies[:2]] == ["pinned: reserved", None]
    # the colour of their live twins: the default one (the colorway's first) set explicitly
    assert copies[0].marker.color == shown.layout.template.layout.colorway[0]
    assert copies[1].marker.color == "#aec7e8"
    assert copies[2].line.dash == PIN_DASH and copies[2].hovertemplate == "pinned: %{y} GiB"
    # one legend entry shows and hides them all
    (key,) = [t for t in shown.data if t.legendgroup == PIN_GROUP and t.showlegend is not False]
    assert key.name == "pinned setting" and list(key.x) == [None]
    title = shown.layout.title.text
    assert title.endswith("<br><sub>pinned: scale=1</sub>")
    assert shown.layout.margin.t == top_margin(title.count("<br>") + 1) > live.layout.margin.t
    assert shown.layout.height == live.layout.height == 420  # the chart does not grow


def test_a_long_label_wraps_to_subtitle_lines_the_top_margin_holds():
    label = ", ".join(f"control_{i}=value_{i}" for i in range(8))
    title = pinned_figure(bars_and_line(1.0), bars_and_line(1.0), label).layout.title.text
    lines = title.split("<br>")
    assert len(lines) == 3 + 3 and all(len(line) <= 70 + len("<sub></sub>") for line in lines)
    assert "".join(lines[3:]).count("control_") == 8


@pytest.mark.parametrize("barmode", ["overlay", "stack", "relative"])
@pytest.mark.parametrize("orientation", ["v", "h"])
def test_bars_that_share_a_place_get_one_group_live_and_one_pinned(barmode, orientation):
    """Overlaid or stacked bars: the live ones overlay or stack as before ("live", or their own
    group), the pinned ones likewise beside them, never on them (seen in Chromium)."""
    shown = pinned_figure(bars_and_line(2.0, barmode, orientation),
                          bars_and_line(1.0, barmode, orientation), "scale=1")
    bars = [(t.name, t.offsetgroup) for t in shown.data if t.type == "bar"]
    assert bars == [("reserved", "reserved"), ("holding", "live"),
                    ("pinned: reserved", "pinned: reserved"), ("pinned: holding", "pinned")]
    assert shown.layout.barmode == barmode


def test_an_axis_range_both_charts_fix_holds_both():
    live = bars_and_line(1.0).update_layout(yaxis_range=[0, 5], xaxis_range=[1.5, -0.5])
    pinned = bars_and_line(4.0).update_layout(yaxis_range=[0, 10], xaxis_range=[2, -1])
    shown = pinned_figure(live, pinned, "scale=4")
    assert list(shown.layout.yaxis.range) == [0, 10]
    assert list(shown.layout.xaxis.range) == [2, -1]  # reversed, as the live one
    assert list(live.layout.yaxis.range) == [0, 5]


def note():
    return note_figure("modelled", "not recorded", "nothing to draw", 360)


def heatmap():
    return style(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])), "Block tables", "computed",
                 height=360)


def timeline():
    return style(go.Figure(go.Bar(name="KV", orientation="h", x=[2.0], base=[1.0], y=["H2D"])),
                 "One decode step", "recorded", height=360)


def segments():
    return style(go.Figure(go.Scatter(name="main loop", x=[0, 1, None, 2, 3],
                                      y=[1, 1, None, 2, 2], mode="lines")),
                 "CTA by CTA", "recorded", height=360)


@pytest.mark.parametrize("live, pinned, why", [
    (note, lambda: bars_and_line(1.0), "this chart has no data"),
    (lambda: bars_and_line(1.0), note, "the pinned chart has no data"),
    (heatmap, heatmap, "this chart is a heatmap"),
    (timeline, timeline, "this chart is a timeline"),
    (segments, segments, "this chart is a timeline"),
    (lambda: bars_and_line(1.0), lambda: bars_and_line(1.0).update_layout(yaxis_title="%"),
     "the pinned chart has other axes"),
    (lambda: bars_and_line(1.0), lambda: bars_and_line(1.0, "stack"),
     "the pinned chart has another bar mode"),
])
def test_charts_that_compare_no_series_show_the_live_one_and_say_the_pin_is_not_drawn(
        live, pinned, why):
    figure = live()
    shown = pinned_figure(figure, pinned(), "block_size=16")
    assert list(shown.data) == list(figure.data)  # nothing added
    assert shown.layout.title.text.endswith(
        f"<sub>pinned: block_size=16</sub><br><sub>pin not drawn: {why}</sub>")
    assert shown.layout.annotations == figure.layout.annotations  # a note's note stays
    assert shown.layout.height == figure.layout.height
