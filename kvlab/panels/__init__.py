"""The kvlab dashboard: one ipywidgets tab (panel) per experiment, each wiring controls to plain
functions. Open it with `kvlab.dashboard()`.

NOTE: this package is `panels`, not `dashboard`, so that importing it never rebinds the
`kvlab.dashboard` function.
"""

from kvlab.panels.app import Dashboard, dashboard

__all__ = ["Dashboard", "dashboard"]
