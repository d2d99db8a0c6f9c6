"""The dashboard shell: a header naming the backend, one `ipywidgets.Tab` page per tab, and an
"Export this tab" button (each chart's data as CSV, and a self-contained HTML report).

A tab is any object with `key`, `title`, `controls`, `figures` and `widget` (see `DashboardTab`);
adding one ("Decode kernels", "KVPR", ...) means appending it in `dashboard()`.
"""

from __future__ import annotations

import html
import time
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
from kvlab.viz.export import figure_csv, html_report, new_export_folder, write_new_files

__all__ = ["Dashboard", "DashboardTab", "dashboard", "export_tab", "header_html"]

EXPORT_FOLDER = "kvlab-export"


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


class Dashboard:
    """Header + tabs. Displays itself in Jupyter through `.widget`.

    controls: `{tab.key: {name: widget}}`, e.g. `dash.controls["paged_cache"]["block_size"]`.
    figures: `{tab.key: {name: FigurePane}}`, e.g. `dash.figures["paged_cache"]["memory"]`.
    """

    def __init__(self, tabs: list[DashboardTab]):
        keys = [tab.key for tab in tabs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tabs have keys {keys}: each key must be unique")
        self.tabs = list(tabs)
        self.header = widgets.HTML(header_html(backend(), device_label()))
        self.tab_widget = widgets.Tab(
            children=[tab.widget for tab in self.tabs], titles=[tab.title for tab in self.tabs]
        )
        self.export_button = widgets.Button(
            description="Export this tab", icon="download",
            tooltip="CSV of each chart's data and a self-contained HTML report, in "
                    f"{EXPORT_FOLDER}/ beside the notebook")
        self.export_links = widgets.HTML()
        self.export_button.on_click(self._on_export)
        self.widget = widgets.VBox([self.header, self.tab_widget,
                                    widgets.HBox([self.export_button, self.export_links])])

    @property
    def controls(self) -> dict[str, dict[str, widgets.Widget]]:
        return {tab.key: tab.controls for tab in self.tabs}

    @property
    def figures(self) -> dict[str, dict[str, FigurePane]]:
        return {tab.key: tab.figures for tab in self.tabs}

    def export(self, button=None, folder=None) -> list[Path]:
        """Export the selected tab (`export_tab`) into `folder` (a str or os.PathLike; default: a
        new folder EXPORT_FOLDER/<time>, with a suffix where an export of the same second took
        that, under the working directory) and show links to the files.

        Raises ValueError as `export_tab` does."""
        tab = self.tabs[self.tab_widget.selected_index or 0]
        if folder is None:
            folder = new_export_folder(EXPORT_FOLDER, time.strftime("%Y%m%d-%H%M%S"))
        paths = export_tab(tab, folder, f"{backend()}: {device_label()}")
        links = ", ".join(f"<a href='{html.escape(str(p))}' target='_blank'>"
                          f"{html.escape(p.name)}</a>" for p in paths)
        self.export_links.value = f"{html.escape(tab.title)} exported: {links}"
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


def dashboard() -> Dashboard:
    """The kvlab dashboard with all its tabs, built afresh (so it reflects `KVLAB_BACKEND` now)."""
    return Dashboard([PagedCacheTab(), DecodeKernelsTab(), KVPRTab(), L2Tab(), EndToEndTab()])
