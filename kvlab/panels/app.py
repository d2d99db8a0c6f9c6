"""The dashboard shell: a header naming the backend, then one `ipywidgets.Tab` page per tab.

A tab is any object with `key`, `title`, `controls`, `figures` and `widget` (see `DashboardTab`);
adding one ("Decode kernels", "KVPR", ...) means appending it in `dashboard()`.
"""

from __future__ import annotations

import html
from typing import Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.device import backend, device_label
from kvlab.panels.decode_kernels import DecodeKernelsTab
from kvlab.panels.kvpr import KVPRTab
from kvlab.panels.paged_cache import PagedCacheTab

__all__ = ["Dashboard", "DashboardTab", "dashboard", "header_html"]


class DashboardTab(Protocol):
    key: str  # e.g. "paged_cache": the key of `Dashboard.controls` / `Dashboard.figures`
    title: str  # the tab's label
    controls: dict[str, widgets.Widget]
    figures: dict[str, go.FigureWidget]
    widget: widgets.Widget


def header_html(backend_name: str, label: str) -> str:
    """The header line: which backend produces the numbers, and how."""
    return (
        f"<b>kvlab</b> &middot; backend: <code>{html.escape(backend_name)}</code> "
        f"&middot; <span style='color:gray'>{html.escape(label)}</span>"
    )


class Dashboard:
    """Header + tabs. Displays itself in Jupyter through `.widget`.

    controls: `{tab.key: {name: widget}}`, e.g. `dash.controls["paged_cache"]["block_size"]`.
    figures: `{tab.key: {name: go.FigureWidget}}`, e.g. `dash.figures["paged_cache"]["memory"]`.
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
        self.widget = widgets.VBox([self.header, self.tab_widget])

    @property
    def controls(self) -> dict[str, dict[str, widgets.Widget]]:
        return {tab.key: tab.controls for tab in self.tabs}

    @property
    def figures(self) -> dict[str, dict[str, go.FigureWidget]]:
        return {tab.key: tab.figures for tab in self.tabs}

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def dashboard() -> Dashboard:
    """The kvlab dashboard with all its tabs, built afresh (so it reflects `KVLAB_BACKEND` now)."""
    return Dashboard([PagedCacheTab(), DecodeKernelsTab(), KVPRTab()])
