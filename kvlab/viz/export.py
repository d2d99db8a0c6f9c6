"""The data behind a chart as a table (CSV), and a self-contained HTML report of several charts:
what the dashboard's "Export" writes.

`figure_table` flattens every trace of a figure into long format: one row per point, with the
trace's name and type, and x, y (and z for heatmaps, text where the trace has it). The figure's
title, provenance included, goes into the report and into a `# ` comment line heading the CSV.
"""

from __future__ import annotations

import html
import io
import re

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["figure_csv", "figure_table", "html_report"]


def _values(trace, key: str) -> np.ndarray | None:
    value = trace[key] if key in trace else None
    return None if value is None else np.asarray(value, dtype=object)


def figure_table(fig: go.Figure):
    """A pandas DataFrame: one row per point of every trace of `fig` (columns trace, type, x, y,
    and z / text where any trace has them; a heatmap's z is laid out by its x and y, or by
    column and row index where it has none)."""
    import pandas as pd

    rows = []
    for i, trace in enumerate(fig.data):
        name = trace.name or f"trace {i}"
        x, y, z, text = (_values(trace, k) for k in ("x", "y", "z", "text"))
        if z is not None and z.ndim == 2:
            num_rows, num_cols = z.shape
            xs = x if x is not None and len(x) == num_cols else np.arange(num_cols)
            ys = y if y is not None and len(y) == num_rows else np.arange(num_rows)
            for r in range(num_rows):
                for c in range(num_cols):
                    rows.append({"trace": name, "type": trace.type, "x": xs[c], "y": ys[r],
                                 "z": z[r, c]})
            continue
        for k in range(max((len(v) for v in (x, y) if v is not None), default=0)):
            row = {"trace": name, "type": trace.type,
                   "x": x[k] if x is not None and k < len(x) else None,
                   "y": y[k] if y is not None and k < len(y) else None}
            if text is not None and text.ndim == 1 and k < len(text):
                row["text"] = text[k]
            rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else ["trace", "type", "x", "y"])
    for column in ("x", "y", "z", "text"):
        if column in frame:
            frame[column] = frame[column].map(_plain)
    return frame


def _plain(value):
    """A cell as text a spreadsheet reads: numbers as numbers, gaps empty, markup removed."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, str):
        return re.sub(r"<br\s*/?>", " ", re.sub(r"<(?!br)[^>]+>", "", value))
    return value


def figure_csv(fig: go.Figure) -> str:
    """`figure_table(fig)` as CSV, headed by one `# ` line per line of the figure's title
    (provenance included)."""
    title = fig.layout.title.text or ""
    lines = [f"# {_plain(line)}" for line in re.split(r"<br\s*/?>", title) if line]
    out = io.StringIO()
    figure_table(fig).to_csv(out, index=False)
    return "\n".join(lines + [out.getvalue()])


def html_report(title: str, header: str, settings: dict, figures: dict[str, go.Figure]) -> str:
    """One self-contained HTML page (plotly.js inside it, no network needed): `title`, the
    `header` line (e.g. the backend and how its numbers come about), the `settings` that made
    the figures as a table, then each figure, interactive."""
    parts = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(header)}</p>",
             "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th>"
                                 f"<td>{html.escape(str(v))}</td></tr>"
                                 for k, v in settings.items()) + "</table>"]
    for i, (name, fig) in enumerate(figures.items()):
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append(pio.to_html(fig, include_plotlyjs=i == 0, full_html=False,
                                 default_width="100%", config={"displaylogo": False}))
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")
