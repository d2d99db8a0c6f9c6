"""The data behind a chart as a table (CSV), and a self-contained HTML report of several charts:
what the dashboard's "Export" writes, into a folder of its own (`new_export_folder`), as new
regular files only (`write_new_files`: never through a link, never over a file).

`figure_table` flattens every trace of a figure into long format: one row per point, with the
trace's name and type, and x, y (and z for heatmaps, text where the trace has it). The figure's
title, provenance included, goes into the report and into a `# ` comment line heading the CSV.
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

__all__ = ["figure_csv", "figure_table", "html_report", "new_export_folder", "write_new_files"]


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


def _folder(folder) -> Path:
    """`folder` (a str or os.PathLike) as a Path; ValueError naming it for anything else."""
    path = os.fspath(folder) if isinstance(folder, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path or "\0" in path:
        raise ValueError(f"folder={folder!r}: must be a str or os.PathLike naming a folder")
    return Path(path)


def new_export_folder(parent, stem: str) -> Path:
    """A new, empty folder `parent/stem`, or `parent/stem-2`, `-3`, ... where that name is taken
    (by an export in the same second, or by anything else: a file, a link), each made atomically
    (`mkdir`, which fails where the name exists); `parent` (a str or os.PathLike) is made where
    absent. Raises ValueError for a `parent` of another type."""
    parent = _folder(parent)
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
    folder = _folder(folder)
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
