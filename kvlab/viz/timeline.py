"""The figure of a traced decode step (a row of `python -m kvlab bench timeline`): every CTA of
`gqa`'s decode and merge launches, and of a plain read of the same bytes, drawn as a bar on the
row of the SM it ran on, coloured by what it was doing (`kvlab.kernels.timeline`'s stamps).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.viz.layout import style

__all__ = ["timeline_figure"]

# (from stamp, to stamp, legend name, colour, line width in px) of each drawn phase
DECODE_PHASES = (("entry", "ready", "decode: block ids and length read", "#d62728", 3),
                 ("ready", "issued", "decode: first copies issued", "#ff9896", 3),
                 ("issued", "landed", "decode: waits for its first tile", "#ffbb78", 3),
                 ("landed", "loop_done", "decode: main loop", "#2ca02c", 3),
                 ("loop_done", "end", "decode: after the loop", "#9467bd", 3))
MERGE_PHASES = (("entry", "released", "merge: waits for the decode grid", "#aaaaaa", 1),
                ("released", "end", "merge: loads and sums the partials", "#1f77b4", 3))
READ_PHASES = (("entry", "end", "read: the same bytes", "#d4a017", 3),)
SPREAD = 0.8  # of an SM's row height, shared by the CTAs that ran on it


def _rows(sm: list[int]) -> list[float]:
    """Each CTA's y: its SM, moved within the SM's row so that CTAs sharing it do not overlap."""
    count, seen = {}, {}
    for s in sm:
        count[s] = count.get(s, 0) + 1
    out = []
    for s in sm:
        k, n = seen.get(s, 0), count[s]
        seen[s] = k + 1
        out.append(s + (k - (n - 1) / 2) * SPREAD / n)
    return out


def _bars(launch: dict, ys: list[float], phases, row: int, fig: go.Figure) -> None:
    """One line trace per phase: a segment per CTA that has both stamps, at its y; segments apart
    by a NaN gap (numpy arrays, which Plotly sends as typed arrays: thousands of CTAs cost no
    validation of each point)."""
    ys = np.asarray(ys, dtype=float)
    for start, stop, name, color, width in phases:
        a, b = np.asarray(launch[start], dtype=float), np.asarray(launch[stop], dtype=float)
        both = (a >= 0) & (b >= 0)
        x = np.full((int(both.sum()), 3), np.nan)
        y = x.copy()
        x[:, 0], x[:, 1] = a[both] / 1000, b[both] / 1000
        y[:, 0] = y[:, 1] = ys[both]
        fig.add_trace(go.Scatter(
            x=x.ravel(), y=y.ravel(), mode="lines", name=name,
            line=dict(color=color, width=width),
            hovertemplate=f"{name}<br>SM %{{y:.0f}}<br>%{{x:.2f}} us<extra></extra>"),
            row=row, col=1)


def timeline_figure(row: dict, provenance: str, height: int = 620, note: str = "") -> go.Figure:
    """The traced step of `row` (its `trace`): on top `gqa`'s decode CTAs (and its merge's) on
    the SMs they ran on, below the read's, both in us from their launch's first CTA; each panel's
    span marked. `note`: a subtitle line (e.g. how the point shown differs from the one asked
    for). Raises ValueError for a row without a trace."""
    trace = row.get("trace")
    if not trace:
        raise ValueError("row has no trace: a row of `python -m kvlab bench timeline` needed")
    p = row["phases"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        row_heights=[0.55, 0.45], subplot_titles=(
                            f"gqa: {p['decode_ctas']} decode CTAs"
                            + (f" and {p['merge_ctas']} merge CTAs" if trace["merge"] else "")
                            + f"; step {p['step_span_us']:.1f} us",
                            f"a plain read of the same bytes: {p['read_ctas']} CTAs; "
                            f"{p['read_span_us']:.1f} us"))
    decode, merge = trace["decode"], trace["merge"]
    # the merge's CTAs share SMs with the decode's: rows spread over both launches
    ys = _rows(decode["sm"] + (merge["sm"] if merge else []))
    _bars(decode, ys[:len(decode["sm"])], DECODE_PHASES, 1, fig)
    if merge:
        _bars(merge, ys[len(decode["sm"]):], MERGE_PHASES, 1, fig)
    _bars(trace["read"], _rows(trace["read"]["sm"]), READ_PHASES, 2, fig)
    for r, span in ((1, p["step_span_us"]), (2, p["read_span_us"])):
        fig.add_vline(x=span, line=dict(color="black", dash="dash", width=1), row=r, col=1)
    for r in (1, 2):
        fig.update_yaxes(title_text="SM", row=r, col=1, rangemode="tozero")
    fig.update_xaxes(title_text="us after the launch's first CTA started", row=2, col=1)
    ms = row["ms"]
    shape = (f"of {row['lengths']}: mean {row['context']}, longest {row['max_context']}"
             if "lengths" in row else f"context={row['context']}")
    details = [f"{row['model']} batch={row['batch']} {shape}",
               f"fp16, block {row['block_size']}, blocks scattered over the pool",
               f"timed: gqa {ms['gqa'] * 1000:.1f} us, read {ms['read'] * 1000:.1f} us; drawn: "
               f"the median of {len(row['phases_runs'])} traced steps"]
    if note:
        details.append(note)
    fig.update_layout(plot_bgcolor="white")
    return style(fig, "A decode step, CTA by CTA: where the time goes", provenance, *details,
                 height=height, legend_y=-0.18)
