"""The dashboard shell: a header naming the backend, one `ipywidgets.Tab` page per tab, and an
"Export this tab" button (each chart's data as CSV, and a self-contained HTML report, in a new
folder under `export_folder`; default: kvlab-export/ in the working directory, which is the
notebook's folder in Jupyter), with links that open the files in a browser tab of their own.

A tab is any object with `key`, `title`, `controls`, `figures` and `widget` (see `DashboardTab`);
adding one ("Decode kernels", "KVPR", ...) means appending it in `dashboard()`.
"""

from __future__ import annotations

import html
import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Protocol

import ipywidgets as widgets

from kvlab.device import backend, device_label
from kvlab.panels.decode_kernels import DecodeKernelsTab
from kvlab.panels.e2e import EndToEndTab
from kvlab.panels.kvpr import KVPRTab
from kvlab.panels.l2 import L2Tab
from kvlab.panels.paged_cache import PagedCacheTab
from kvlab.panels.widgets import FigurePane
from kvlab.viz.export import (
    check_folder,
    figure_csv,
    html_report,
    new_export_folder,
    write_new_files,
)

__all__ = ["Dashboard", "DashboardTab", "dashboard", "export_message", "export_tab", "files_url",
           "header_html"]

EXPORT_FOLDER = "kvlab-export"  # the default export_folder, in the working directory
# NOTE: ipywidgets gives every tab a basis of 144 px and lets it shrink to 35 px, its title cut to
# fit (`.jupyter-widget-tab > .lm-TabBar .lm-TabBar-tab`): at 1,000 px, the file browser open,
# each tab gets 114 px and "L2 and counters" needs 115. A tab here never gets narrower than its
# title; the header's HTML carries the rule into the page.
TAB_STYLE = ("<style>.jupyter-widgets.widget-tab.kvlab-tabs > .lm-TabBar .lm-TabBar-tab,"
             ".jupyter-widgets.widget-tab.kvlab-tabs > .p-TabBar .p-TabBar-tab"
             "{min-width: fit-content}</style>")


class DashboardTab(Protocol):
    key: str  # e.g. "paged_cache": the key of `Dashboard.controls` / `Dashboard.figures`
    title: str  # the tab's label
    controls: dict[str, widgets.Widget]
    figures: dict[str, FigurePane]
    widget: widgets.Widget


def header_html(backend_name: str, label: str) -> str:
    """The header line: which backend produces the numbers, and how."""
    return (
        f"<b>kvlab</b> &middot; backend: <code>{html.escape(backend_name)}</code> "
        f"&middot; <span style='color:gray'>{html.escape(label)}</span>"
    )


def export_tab(tab: DashboardTab, folder, header: str) -> list[Path]:
    """Write what `tab` shows into `folder` (a str or os.PathLike; made where absent): one CSV per
    chart (the data behind it) and one self-contained HTML report (the controls' values and every
    chart), each a new regular file (`write_new_files`). Returns the paths.

    Raises ValueError, before writing anything, for a `folder` of another type, one that is a
    symbolic link or not a folder, or one that holds a file of those names already."""
    figures = {name: pane.figure for name, pane in tab.figures.items()}
    files = {f"{tab.key}-{name}.csv": figure_csv(fig) for name, fig in figures.items()}
    settings = {name: control.value for name, control in tab.controls.items()
                if hasattr(control, "value")}
    files[f"{tab.key}.html"] = html_report(f"kvlab: {tab.title}", header, settings, figures)
    return write_new_files(folder, files)


def _jupyter_server() -> tuple[str, Path] | None:
    """The base URL and root folder of the Jupyter server that started this kernel: the process
    JPY_PARENT_PID names (as jupyter_client sets it), from the file that server describes itself
    in (jpserver-<pid>.json in Jupyter's runtime folder; nbserver-<pid>.json: classic Notebook).
    None outside a Jupyter server (a script, VS Code)."""
    pid = os.environ.get("JPY_PARENT_PID", "")
    if not pid.isdigit():
        return None
    from jupyter_core.paths import jupyter_runtime_dir

    for name in (f"jpserver-{pid}.json", f"nbserver-{pid}.json"):
        try:
            info = json.loads((Path(jupyter_runtime_dir()) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        base_url, root = info.get("base_url"), info.get("root_dir", info.get("notebook_dir"))
        if isinstance(base_url, str) and isinstance(root, str) and root:
            return base_url, Path(root).expanduser()
    return None


def files_url(path, server: tuple[str, Path] | None) -> str | None:
    """The URL at which `server` ((base URL, root folder), as `_jupyter_server` gives it) serves
    the file `path` as it is (its /files/ route), or None where it serves no such file: no
    server, a file outside its root folder, or a hidden one (a name starting with ".").

    NOTE: a link to it opens in a browser tab of its own, where an HTML file's scripts run (in a
    sandbox of its own origin) with no "Trust HTML" step, in JupyterLab and in Notebook alike; a
    relative link would open the file inside JupyterLab (/lab/tree/...), untrusted. The server
    checks the Referer of such a request, so the link must not be rel="noreferrer"."""
    if server is None:
        return None
    base_url, root = server
    try:
        relative = Path(path).resolve().relative_to(root.resolve())
    except ValueError:
        return None
    if not relative.parts or any(part.startswith(".") for part in relative.parts):
        return None
    return (f"{base_url.rstrip('/')}/files/"
            f"{urllib.parse.quote(relative.as_posix())}")


def export_message(title: str, paths: list[Path], server: tuple[str, Path] | None) -> str:
    """The line shown after an export: `title`, the full path of the folder written, and each
    file (the HTML report first) as a link that opens it in a browser tab of its own
    (`files_url`), or by name where `server` serves none."""
    folder = paths[0].parent if paths else Path()
    names = []
    for path in sorted(paths, key=lambda p: p.suffix != ".html"):
        url = files_url(path, server)
        name = html.escape(path.name)
        names.append(f"<a href='{html.escape(url)}' target='_blank' style='color:#1a6fc9;"
                     f"text-decoration:underline'>{name}</a>" if url else name)
    return (f"<span style='overflow-wrap:anywhere'>{html.escape(title)} exported to "
            f"<code>{html.escape(str(folder))}</code>: {', '.join(names)}</span>")


class Dashboard:
    """Header + tabs. Displays itself in Jupyter through `.widget`.

    controls: `{tab.key: {name: widget}}`, e.g. `dash.controls["paged_cache"]["block_size"]`.
    figures: `{tab.key: {name: FigurePane}}`, e.g. `dash.figures["paged_cache"]["memory"]`.
    export_folder: where the export button writes, each time in a new folder named by the time
    (a str or os.PathLike, "~" expanded; default: EXPORT_FOLDER in the working directory). Raises
    ValueError naming it for another type.
    """

    def __init__(self, tabs: list[DashboardTab], export_folder=None):
        keys = [tab.key for tab in tabs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tabs have keys {keys}: each key must be unique")
        self.export_folder = (None if export_folder is None else
                              check_folder(export_folder, "export_folder").expanduser())
        self.tabs = list(tabs)
        self.header = widgets.HTML(header_html(backend(), device_label()) + TAB_STYLE)
        self.tab_widget = widgets.Tab(
            children=[tab.widget for tab in self.tabs], titles=[tab.title for tab in self.tabs]
        )
        self.tab_widget.add_class("kvlab-tabs")
        where = self.export_folder or f"{EXPORT_FOLDER}/ in the working directory"
        # NOTE: a Button has a short control's width and shrinks beside a long message (its label
        # cut to "Export this ..."); as wide as its label and never shrunk, it stays whole, and
        # the message beside it wraps instead
        self.export_button = widgets.Button(
            description="Export this tab", icon="download",
            layout=widgets.Layout(width="auto", flex="0 0 auto"),
            tooltip="CSV of each chart's data and a self-contained HTML report, in a new folder "
                    f"under {where}")
        self.export_links = widgets.HTML(layout=widgets.Layout(flex="1 1 auto", min_width="0"))
        self.export_button.on_click(self._on_export)
        self.widget = widgets.VBox([self.header, self.tab_widget,
                                    widgets.HBox([self.export_button, self.export_links],
                                                 layout=widgets.Layout(align_items="center"))])

    @property
    def controls(self) -> dict[str, dict[str, widgets.Widget]]:
        return {tab.key: tab.controls for tab in self.tabs}

    @property
    def figures(self) -> dict[str, dict[str, FigurePane]]:
        return {tab.key: tab.figures for tab in self.tabs}

    def export(self, button=None, folder=None) -> list[Path]:
        """Export the selected tab (`export_tab`) into `folder` (a str or os.PathLike, "~"
        expanded; default: a new folder <time> in `export_folder`, with a suffix where an export
        of the same second took that) and show the folder's full path and links to the files.
        Returns the files' full paths.

        Raises ValueError as `export_tab` does."""
        tab = self.tabs[self.tab_widget.selected_index or 0]
        if folder is None:
            parent = self.export_folder or Path(EXPORT_FOLDER)
            folder = new_export_folder(parent.expanduser().absolute(),
                                       time.strftime("%Y%m%d-%H%M%S"))
        folder = check_folder(folder).expanduser().absolute()
        paths = export_tab(tab, folder, f"{backend()}: {device_label()}")
        self.export_links.value = export_message(tab.title, paths, _jupyter_server())
        return paths

    def _on_export(self, button) -> None:
        """The button's export: a click handler's traceback reaches only the log, so an error is
        shown beside the button."""
        try:
            self.export()
        except (ValueError, OSError) as error:
            self.export_links.value = (f"<span style='color:#d62728'>export failed: "
                                       f"{html.escape(str(error))}</span>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def dashboard(export_folder=None) -> Dashboard:
    """The kvlab dashboard with all its tabs, built afresh (so it reflects `KVLAB_BACKEND` now);
    its export button writes under `export_folder` (see `Dashboard`)."""
    return Dashboard([PagedCacheTab(), DecodeKernelsTab(), KVPRTab(), L2Tab(), EndToEndTab()],
                     export_folder=export_folder)
