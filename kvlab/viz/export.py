"""The data behind a chart as a table (CSV), and a self-contained HTML report of several charts:
what the dashboard's "Export" writes, into a folder of its own (`new_export_folder`), as new
regular files only (`write_new_files`: never through a link, never over a file).

`figure_table` flattens every trace of a figure into long format: one row per point, with the
trace's name and type, and its values in columns named by the axis that gives them their meaning
("y: internal fragmentation (%)"), so that a spreadsheet shows names and units. The figure's
title, provenance included, goes into the report and into `# ` comment lines heading the CSV.
"""

from __future__ import annotations

import html
import io
import itertools
import os
import re
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["check_folder", "check_folder_to_make", "figure_csv", "figure_table", "html_report",
           "new_export_folder", "write_new_files"]

# The order of a table's value columns, by the first word of their names.
_COLUMN_ORDER = {"x": 0, "y": 1, "z": 2, "text": 3}


def _values(trace, key: str) -> np.ndarray | None:
    value = trace[key] if key in trace else None
    return None if value is None else np.asarray(value, dtype=object)


def _title(owner: dict) -> str:
    """The plain text of `owner`'s title (an axis or a colorbar, as plain JSON), "" where none."""
    title = owner.get("title") or {}
    text = title.get("text") if isinstance(title, dict) else title
    return _plain(text).strip() if isinstance(text, str) else ""


def _axis_title(layout: dict, axis_id: str) -> str:
    """The title of axis `axis_id` ("x", "y2", ...), or where it has none, that of the axis it
    `matches` (a shared axis of subplots carries its title once)."""
    seen = set()
    while axis_id and axis_id not in seen:
        seen.add(axis_id)
        axis = layout.get(f"{axis_id[0]}axis{axis_id[1:]}") or {}
        if _title(axis):
            return _title(axis)
        axis_id = axis.get("matches")
    return ""


def _column(name: str, title: str) -> str:
    """A value column's name: `name` ("x", "y start", ...) and its axis's `title`, if any."""
    return f"{name}: {title}" if title else name


def _number(value) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))


def figure_table(fig: go.Figure):
    """A pandas DataFrame: one row per point of every trace of `fig`. Columns: trace (its name),
    type, then the values, each column named by its axis and that axis's title, e.g.
    "x: block_size (tokens)", "y: GiB" (just "x" where the axis has no title; axes of one letter
    and one title share a column); a heatmap's "z: <colorbar title>", laid out by its x and y, or
    by column and row index where it has none; "text" where a trace has text. A bar drawn from a
    `base` (a timeline) gives where it starts and ends instead of its length: "x start: <title>",
    "x end: <title>" (y for a vertical bar). A point with neither x nor y (a gap between a line's
    segments, a legend entry's [None]) gives no row."""
    import pandas as pd

    layout = fig.layout.to_plotly_json()
    rows = []
    for i, trace in enumerate(fig.data):
        name = trace.name or f"trace {i}"
        x, y, z, text = (_values(trace, k) for k in ("x", "y", "z", "text"))
        titles = {"x": _axis_title(layout, getattr(trace, "xaxis", None) or "x"),
                  "y": _axis_title(layout, getattr(trace, "yaxis", None) or "y")}
        if z is not None and z.ndim == 2:
            colorbar = trace.colorbar.to_plotly_json() if "colorbar" in trace else {}
            if getattr(trace, "coloraxis", None):
                colorbar = (layout.get(trace.coloraxis) or {}).get("colorbar") or {}
            x_col, y_col = _column("x", titles["x"]), _column("y", titles["y"])
            z_col = _column("z", _title(colorbar))
            num_rows, num_cols = z.shape
            xs = x if x is not None and len(x) == num_cols else np.arange(num_cols)
            ys = y if y is not None and len(y) == num_rows else np.arange(num_rows)
            for r in range(num_rows):
                for c in range(num_cols):
                    rows.append({"trace": name, "type": trace.type, x_col: xs[c], y_col: ys[r],
                                 z_col: z[r, c]})
            continue
        base = _values(trace, "base") if trace.type == "bar" else None
        size_axis = "x" if getattr(trace, "orientation", None) == "h" else "y"
        for k in range(max((len(v) for v in (x, y) if v is not None), default=0)):
            point = [values[k] if values is not None and k < len(values) else None
                     for values in (x, y)]
            if all(value is None for value in point):
                continue
            row = {"trace": name, "type": trace.type}
            for axis, value in zip(("x", "y"), point, strict=True):
                if base is None or axis != size_axis:
                    row[_column(axis, titles[axis])] = value
                    continue
                # NOTE: a bar with a base spans [base, base + value] of its size axis
                start = base[()] if base.ndim == 0 else base[k] if k < len(base) else None
                start = start if _number(start) else None
                end = start + value if start is not None and _number(value) else None
                row[_column(f"{axis} start", titles[axis])] = start
                row[_column(f"{axis} end", titles[axis])] = end
            if text is not None and text.ndim == 1 and k < len(text):
                row["text"] = text[k]
            rows.append(row)
    frame = pd.DataFrame(rows, columns=None if rows else ["trace", "type", "x", "y"])
    # x, y, z, then text; in the order first seen within each (sorted is stable)
    values = sorted((c for c in frame.columns if c not in ("trace", "type")),
                    key=lambda c: _COLUMN_ORDER[re.split(r"[ :]", c)[0]])
    frame = frame[["trace", "type", *values]]
    for column in values:
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


# NOTE: plotly.js issue #7750 (seen in 4.1.1, plotly 7.1's): on a figure's first draw, a title
# with `automargin` (every kvlab title: kvlab.viz.layout) pushes the top margin down after the
# data layer was placed there; the axes move with the margin, the bars and lines do not: ~20 px
# off their axes. Any second draw places both by the pushed margin (a resize is one: why the
# dashboard is right); the report asks for one at once.
_REDRAW = "return Plotly.redraw(document.getElementById('{plot_id}'));"


def html_report(title: str, header: str, settings: dict, figures: dict[str, go.Figure]) -> str:
    """One self-contained HTML page (plotly.js inside it, once, no network needed): `title`, the
    `header` line (e.g. the backend and how its numbers come about), the `settings` that made
    the figures as a table, then each figure, interactive, its data drawn on its axes."""
    parts = [f"<h1>{html.escape(title)}</h1>", f"<p>{html.escape(header)}</p>",
             "<table>" + "".join(f"<tr><th>{html.escape(str(k))}</th>"
                                 f"<td>{html.escape(str(v))}</td></tr>"
                                 for k, v in settings.items()) + "</table>"]
    for i, (name, fig) in enumerate(figures.items()):
        parts.append(f"<h2>{html.escape(name)}</h2>")
        parts.append(pio.to_html(fig, include_plotlyjs=i == 0, include_mathjax=False,
                                 full_html=False, default_width="100%", post_script=_REDRAW,
                                 config={"displaylogo": False}))
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{style}</style></head><body>{''.join(parts)}</body></html>")


def check_folder(folder, name: str = "folder") -> Path:
    """`folder` (a str or os.PathLike) as a Path; ValueError naming it (as `name`) for anything
    else."""
    path = os.fspath(folder) if isinstance(folder, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"{name}={folder!r}: must be a str or os.PathLike naming a folder")
    return Path(path)


def check_folder_to_make(folder, name: str = "folder") -> Path:
    """`check_folder`'s Path, "~" expanded; ValueError naming it (as `name`) where it, or the
    nearest of its parents that exists, is not a folder: no folder can be made there."""
    path = check_folder(folder, name).expanduser()
    there = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if there is not None and not there.is_dir():
        raise ValueError(f"{name}={folder!r}: {there} is not a folder")
    return path


def new_export_folder(parent, stem: str) -> Path:
    """A new, empty folder `parent/stem`, or `parent/stem-2`, `-3`, ... where that name is taken
    (by an export in the same second, or by anything else: a file, a link), each made atomically
    (`mkdir`, which fails where the name exists); `parent` (a str or os.PathLike) is made where
    absent. Raises ValueError for a `parent` of another type, or where it is, or is in, a file
    (`check_folder_to_make`)."""
    parent = check_folder_to_make(parent, "parent")
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        folder = parent / (stem if n == 1 else f"{stem}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            pass


def write_new_files(folder, files: dict[str, str]) -> list[Path]:
    """Write each text of `files` ({file name: text}, UTF-8) as a new regular file in `folder` (a
    str or os.PathLike; made where absent), never through a symbolic link and never over a file.
    Returns the paths, in the order of `files`.

    Raises ValueError, before writing any file, for a `folder` of another type, one that is a
    symbolic link or not a folder, a name that is not a plain file name, or a name that `folder`
    holds already (a file, a folder or a link)."""
    folder = check_folder(folder)
    bad = [n for n in files if not isinstance(n, str) or n in ("", ".", "..") or "\0" in n
           or Path(n).name != n]
    if bad:
        raise ValueError(f"files={bad}: must be plain file names (no folder)")
    if folder.is_symlink():
        raise ValueError(f"folder={str(folder)!r}: is a symbolic link: must be a folder")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r}: is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    # NOTE: every name opened relative to the folder's own descriptor, taken without following
    # a link: a link swapped in for the folder after the checks above fails here (ELOOP)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        taken = [n for n in files if _exists(n, dir_fd)]
        if taken:
            raise ValueError(f"folder={str(folder)!r}: holds {taken} already: an export writes "
                             "new files only (leave folder out for a new one)")
        for name, text in files.items():
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666, dir_fd=dir_fd)
            with open(fd, "w", encoding="utf-8") as f:
                f.write(text)
    finally:
        os.close(dir_fd)
    return [folder / name for name in files]


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
