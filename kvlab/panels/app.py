"""The dashboard shell: a header naming the backend, one `ipywidgets.Tab` page per tab, an
"Export this tab" button (each chart's data as CSV, and a self-contained HTML report, in a new
folder under `export_folder`; default: kvlab-export/ in the working directory, which is the
notebook's folder in Jupyter), with links that open the files in a browser tab of their own, and
"Pin this setting" / "Clear pin" buttons: each chart of the tab keeps its figure at the controls'
setting now, drawn dimmed beside the live one as the controls change, and exported with it
(`FigurePane.pin`).

A tab is any object with `key`, `title`, `controls`, `figures` and `widget` (see `DashboardTab`);
adding one ("Decode kernels", "KVPR", ...) means appending its class to `TABS`. `dashboard()`
builds the first tab at once and each other one when it is first selected or used (`LazyTab`).
"""

from __future__ import annotations

import html
import json
import os
import time
import urllib.parse
from collections.abc import Callable
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
    check_folder_to_make,
    figure_csv,
    html_report,
    new_export_folder,
    write_new_files,
)

__all__ = ["Dashboard", "DashboardTab", "LazyTab", "TABS", "dashboard", "export_message",
           "export_tab", "files_url", "control_values", "header_html", "setting_label"]

TABS = (PagedCacheTab, DecodeKernelsTab, KVPRTab, L2Tab, EndToEndTab)  # dashboard()'s, in order
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


class LazyTab:
    """A tab built by `make()` when first used: `key`, `title` and `widget` are there at once (the
    widget a box that says the tab is being built, then holds the built tab's widget); reading any
    other attribute (`controls`, `figures`, `refresh`, ...) builds the tab and gives the built
    tab's. `build()` builds it and returns it. A `Dashboard` builds a lazy tab when it is selected,
    so a dashboard opens without drawing the tabs nobody has looked at (the L2 tab's modelled chart
    alone takes a second on a CPU)."""

    def __init__(self, make: Callable[[], DashboardTab], key: str, title: str):
        self._built: DashboardTab | None = None
        self._make = make
        self.key, self.title = key, title
        self.widget = widgets.VBox([widgets.HTML(f"<i>building {html.escape(title)}...</i>")])

    def build(self) -> DashboardTab:
        if self._built is None:
            self._built = self._make()
            self.widget.children = [self._built.widget]
        return self._built

    def __getattr__(self, name: str):
        if name.startswith("_"):  # never build for a private name (copy, pickle, repr probes)
            raise AttributeError(name)
        return getattr(self.build(), name)


def header_html(backend_name: str, label: str) -> str:
    """The header line: which backend produces the numbers, and how."""
    return (
        f"<b>kvlab</b> &middot; backend: <code>{html.escape(backend_name)}</code> "
        f"&middot; <span style='color:gray'>{html.escape(label)}</span>"
    )


def export_tab(tab: DashboardTab, folder, header: str) -> list[Path]:
    """Write what `tab` shows into `folder` (a str or os.PathLike; made where absent): one CSV per
    chart (the data behind it, pinned series included) and one self-contained HTML report (the
    controls' values, the pinned setting where there is one, and every chart), each a new regular
    file (`write_new_files`). Returns the paths.

    Raises ValueError, before writing anything, for a `folder` of another type, one that is a
    symbolic link or not a folder, or one that holds a file of those names already."""
    figures = {name: pane.figure for name, pane in tab.figures.items()}
    files = {f"{tab.key}-{name}.csv": figure_csv(fig) for name, fig in figures.items()}
    settings = {name: control.value for name, control in tab.controls.items()
                if hasattr(control, "value")}
    pinned = _pin_label(tab)
    if pinned is not None:
        settings["pinned setting"] = pinned
    files[f"{tab.key}.html"] = html_report(f"kvlab: {tab.title}", header, settings, figures)
    return write_new_files(folder, files)


def control_values(controls: dict[str, widgets.Widget]) -> dict[str, str]:
    """{name: value as text} of each control of `controls` that has a value (a number in its
    shortest form: 0.5, not 0.50)."""
    return {name: f"{control.value:g}" if isinstance(control.value, float) else
            str(control.value) for name, control in controls.items() if hasattr(control, "value")}


def setting_label(values: dict[str, str]) -> str:
    """`values` ({name: value as text}) as "name=value" pairs: "block_size=16, batch=8"."""
    return ", ".join(f"{name}={value}" for name, value in values.items())


def _pin_label(tab: DashboardTab) -> str | None:
    """The label of the setting pinned on `tab`'s charts, or None where none is."""
    labels = dict.fromkeys(pane.pinned.label for pane in tab.figures.values() if pane.pinned)
    return "; ".join(labels) if labels else None


def _button(description: str, icon: str, tooltip: str) -> widgets.Button:
    """A button of the row below the tabs.

    NOTE: a Button has a short control's width and shrinks beside a long message (its label cut
    to "Export this ..."); as wide as its label and never shrunk, it stays whole, and the message
    beside it wraps instead."""
    return widgets.Button(description=description, icon=icon, tooltip=tooltip,
                          layout=widgets.Layout(width="auto", flex="0 0 auto"))


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
    ValueError naming it for another type, or where it is, or is in, a file.
    The pin buttons act on the selected tab (`pin`, `unpin`); the line below them names the
    setting pinned there.
    """

    def __init__(self, tabs: list[DashboardTab], export_folder=None):
        keys = [tab.key for tab in tabs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"tabs have keys {keys}: each key must be unique")
        self.export_folder = (None if export_folder is None else
                              check_folder_to_make(export_folder, "export_folder"))
        self.tabs = list(tabs)
        self.header = widgets.HTML(header_html(backend(), device_label()) + TAB_STYLE)
        self.tab_widget = widgets.Tab(
            children=[tab.widget for tab in self.tabs], titles=[tab.title for tab in self.tabs]
        )
        self.tab_widget.add_class("kvlab-tabs")
        where = self.export_folder or f"{EXPORT_FOLDER}/ in the working directory"
        self.export_button = _button(
            "Export this tab", "download", "CSV of each chart's data and a self-contained HTML "
            f"report, in a new folder under {where}")
        self.pin_button = _button(
            "Pin this setting", "thumb-tack", "Keep this tab's charts at the setting now, drawn "
            "dimmed beside the live ones as the controls change, and exported with them")
        self.unpin_button = _button("Clear pin", "times", "Drop this tab's pinned setting")
        self.export_links = widgets.HTML(layout=widgets.Layout(flex="1 1 auto", min_width="0"))
        self.pin_line = widgets.HTML()
        self.export_button.on_click(self._on_export)
        self.pin_button.on_click(lambda button: self.pin())
        self.unpin_button.on_click(lambda button: self.unpin())
        self.tab_widget.observe(self._build_selected, names="selected_index")
        self.tab_widget.observe(self._show_pin, names="selected_index")
        self._show_pin()
        buttons = [self.export_button, self.pin_button, self.unpin_button, self.export_links]
        self.widget = widgets.VBox([self.header, self.tab_widget,
                                    widgets.HBox(buttons,
                                                 layout=widgets.Layout(align_items="center")),
                                    self.pin_line])

    @property
    def controls(self) -> dict[str, dict[str, widgets.Widget]]:
        return {tab.key: tab.controls for tab in self.tabs}

    @property
    def figures(self) -> dict[str, dict[str, FigurePane]]:
        return {tab.key: tab.figures for tab in self.tabs}

    def _tab(self, tab_key: str | None) -> DashboardTab:
        """The tab of `tab_key`, or the selected one for None; ValueError naming it for another
        key."""
        if tab_key is None:
            return self.tabs[self.tab_widget.selected_index or 0]
        for tab in self.tabs:
            if tab.key == tab_key:
                return tab
        raise ValueError(f"tab_key={tab_key!r}: must be one of {[t.key for t in self.tabs]}")

    def pin(self, tab_key: str | None = None) -> str:
        """Pin the setting of tab `tab_key` (default: the selected tab) now: each of its charts
        keeps its figure, labelled with the controls' values (`setting_label`), and draws it
        beside the live one at once and on every change, its subtitle naming the pinned values
        that differ from the controls', until `unpin`; a pin there before is replaced. Returns
        the label. Raises ValueError naming `tab_key` for a key no tab has."""
        tab = self._tab(tab_key)
        pinned = control_values(tab.controls)
        label = setting_label(pinned) or tab.title

        def differs() -> str:
            now = control_values(tab.controls)
            return setting_label({k: v for k, v in pinned.items() if now.get(k) != v})

        for pane in tab.figures.values():
            pane.pin(label, differs)
        self._show_pin()
        return label

    def unpin(self, tab_key: str | None = None) -> None:
        """Drop the pin of tab `tab_key` (default: the selected tab): its charts show the live
        figures alone. Raises ValueError naming `tab_key` for a key no tab has."""
        for pane in self._tab(tab_key).figures.values():
            pane.unpin()
        self._show_pin()

    def _build_selected(self, change=None) -> None:
        """A lazy tab is built when it is selected."""
        tab = self._tab(None)
        if isinstance(tab, LazyTab):
            tab.build()

    def _show_pin(self, change=None) -> None:
        """The line below the buttons names the selected tab's pinned setting; "Clear pin" is
        enabled where there is one."""
        label = _pin_label(self._tab(None)) if self.tabs else None
        self.unpin_button.disabled = label is None
        self.pin_line.value = "" if label is None else (
            f"<span style='overflow-wrap:anywhere'><span style='color:gray'>pinned (drawn dimmed "
            f"beside the live charts):</span> {html.escape(label)}</span>")

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
    """The kvlab dashboard with all its tabs (`TABS`), made afresh: its header names the backend
    now (`KVLAB_BACKEND`); the first tab is built at once, the others when first selected or used
    (`LazyTab`), each on the backend then. Its export button writes under `export_folder` (see
    `Dashboard`)."""
    first, *others = TABS
    return Dashboard([first(), *(LazyTab(cls, cls.key, cls.title) for cls in others)],
                     export_folder=export_folder)
