"""Driving JupyterLab in Chromium for the browser tests: a server started in a temporary folder
and always stopped by the PID it started, and the in-page questions the tests ask.

Chromium is Debian's (`apt-get install chromium`, at CHROMIUM); Playwright's Python package drives
it and downloads no browser. The server exposes the app in the page (`window.jupyterapp`), so
the tests run cells through JupyterLab's own commands.
"""

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("KVLAB_ARTIFACTS", ROOT / "build" / "browser"))
TOKEN = "kvlab-browser-test"
WIDTHS = (1280, 1000)  # the window widths the tests look at
# every browser test's marks: `browser`, and skipped without Chromium
BROWSER_TEST = [pytest.mark.browser,
                pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                   reason=f"needs Chromium at {CHROMIUM}")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the server's process: get SIGTERM when the process that started it dies, however it
    dies (Linux prctl PR_SET_PDEATHSIG), so that no server outlives a killed test run."""
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def jupyterlab(folder: Path, timeout_s: float = 60):
    """A JupyterLab server on 127.0.0.1 serving `folder` (the simulated backend; this checkout's
    kvlab first on the kernel's path): yields its base URL. Stopped, with everything it started,
    by its process group when the block ends, and by the kernel (SIGTERM) if this process dies
    first."""
    port = free_port()
    env = {**os.environ, "KVLAB_BACKEND": "sim",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = open(folder / "jupyterlab.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(  # noqa: PLW1509 (preexec_fn: the server dies with this process)
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--allow-root", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={folder}",
         f"--LabApp.workspaces_dir={folder / 'workspaces'}", "--LabApp.news_url=",
         f"--LabApp.user_settings_dir={_settings(folder)}",
         "--LabApp.expose_app_in_browser=True"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=_die_with_parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
                break
            except OSError as err:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start in {timeout_s} s: "
                                       f"{(folder / 'jupyterlab.log').read_text()[-2000:]}"
                                       ) from err
                time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


SETTINGS = {  # user settings of the test's JupyterLab
    # every cell kept in the page (no windowing): the tests see every output, on screen or not
    "notebook-extension/tracker": '{"windowingMode": "none"}',
    # no "Would you like to get notified about official Jupyter news?" over the outputs
    "apputils-extension/notification": '{"fetchNews": "false", "checkForUpdates": false}',
}


def _settings(folder: Path) -> Path:
    for name, text in SETTINGS.items():
        path = folder / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder / "settings"


def copy_notebook(folder: Path, name: str = "walkthrough.ipynb") -> Path:
    return Path(shutil.copy(ROOT / "notebooks" / name, folder / name))


def new_notebook(folder: Path, name: str, source: str) -> Path:
    """A notebook as a person starts one: one code cell of `source`, never run."""
    cell = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": source}
    path = folder / name
    path.write_text(json.dumps({
        "cells": [cell], "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                     "display_name": "Python 3"}},
        "nbformat": 4, "nbformat_minor": 5}))
    return path


# In-page JavaScript, on the notebook panel JupyterLab shows (window.jupyterapp).
NOTEBOOK = "(window.jupyterapp && window.jupyterapp.shell.currentWidget)"
CELLS_DONE = f"""() => {{
    const panel = {NOTEBOOK};
    if (!panel || !panel.sessionContext || !panel.sessionContext.session) return false;
    const kernel = panel.sessionContext.session.kernel;
    const cells = panel.content.widgets.filter(c => c.model.type === 'code');
    return kernel.status === 'idle' && cells.every(c => c.model.executionCount !== null);
}}"""
CELL_PROBLEMS = f"""() => {{
    const problems = [];
    {NOTEBOOK}.content.widgets.forEach((cell, i) => {{
        if (cell.model.type !== 'code') return;
        for (const out of cell.model.outputs.toJSON()) {{
            if (out.output_type === 'error')
                problems.push(`cell ${{i}}: ${{out.ename}}: ${{out.evalue}}`);
            if (out.output_type === 'stream' && out.name === 'stderr') {{
                const text = [].concat(out.text).join('').slice(0, 300);
                problems.push(`cell ${{i}} stderr: ${{text}}`);
            }}
        }}
    }});
    return problems;
}}"""
# A trace's array is plain, or a typed array as Plotly sends numpy data ({dtype, bdata, shape},
# decoded into _inputArray in the page).
PLOTS = """() => { const size = v => !v ? 0 : (v._inputArray || v).length || 0;
  return Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    traces: (el.data || []).length,
    // a chart with nothing to draw shows a note instead (kvlab.viz.layout.note_figure)
    note: !(el.data || []).length && ((el.layout || {}).annotations || []).length > 0,
    points: (el.data || []).reduce((n, t) => n + ['x', 'y', 'z', 'values'].reduce(
        (m, k) => m + size(t[k]), 0), 0),
    visible: el.offsetParent !== null,
    in_dashboard: el.closest('.widget-tab') !== null,
    json: JSON.stringify((el.data || []).map(t => [t.x, t.y, t.z])).slice(0, 20000),
  })); }"""


# The charts (FigurePanes: widget Outputs) of the dashboard tab on show: each one's traces, whether
# it shows a note instead, how tall its Plotly figure is drawn (0: none drawn), and how much
# narrower than its pane (the chart's paper against the widget's box).
SHOWN_CHARTS = """() => Array.from(document.querySelectorAll('.widget-tab .widget-output'))
  .filter(out => out.offsetParent !== null).map(out => {
    const el = out.querySelector('.js-plotly-plot'), data = (el && el.data) || [];
    const paper = el && el.querySelector('.main-svg');
    return {traces: data.length,
            note: !data.length && !!el && ((el.layout || {}).annotations || []).length > 0,
            height: el ? Math.round(el.getBoundingClientRect().height) : 0,
            narrower_px: Math.round(out.getBoundingClientRect().width
                                    - (paper ? paper.getBoundingClientRect().width : 0))};
  })"""
MIN_CHART_PX = 100  # a chart drawn is taller; a collapsed one is 0 px
# In-page: from the next input event on (a key, a click, a value changed), the ms from it to each
# chart (a Plotly figure in a widget Output) drawn anew (a new figure, or new data in one) taller
# than MIN_CHART_PX, in window.kvlabRedraws.drawn_ms. Not the copies that the renderer draws off
# the page to keep a PNG of each figure (Plotly.toImage). Watching again stops the previous watch.
WATCH_REDRAWS = f"""() => {{
  const before = new Map(Array.from(document.querySelectorAll('.js-plotly-plot'),
                                    el => [el, el.data]));
  const watch = window.kvlabRedraws = {{start: null, drawn_ms: []}};
  const start = () => {{ if (watch.start === null) watch.start = performance.now(); }};
  for (const type of ['keydown', 'input', 'change', 'click'])
    document.addEventListener(type, start, {{capture: true, once: true}});
  const done = new Set();
  const frame = () => {{
    if (window.kvlabRedraws !== watch) return;
    if (watch.start !== null) document.querySelectorAll('.js-plotly-plot').forEach(el => {{
      if (done.has(el) || before.get(el) === el.data || !(el.data || []).length
          || !el.closest('.widget-output')) return;
      if (el.getBoundingClientRect().height <= {MIN_CHART_PX}) return;
      done.add(el);
      watch.drawn_ms.push(performance.now() - watch.start);
    }});
    requestAnimationFrame(frame);
  }};
  requestAnimationFrame(frame);
}}"""


def run_all(page, timeout_s: float = 300) -> None:
    """Run every cell of the notebook on the page, and wait until each has run."""
    page.wait_for_function(f"() => {NOTEBOOK} && {NOTEBOOK}.sessionContext && "
                           f"{NOTEBOOK}.sessionContext.isReady",
                           timeout=timeout_s * 1000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(CELLS_DONE, timeout=timeout_s * 1000, polling=500)


def wait_for_plots(page, timeout_s: float = 60) -> list[dict]:
    """The Plotly figures on the page once every one has traces or a note (or the last answer at
    the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        plots = page.evaluate(PLOTS)
        if (plots and all(p["traces"] or p["note"] for p in plots)) or (
                time.monotonic() > deadline):
            return plots
        time.sleep(0.5)


def chart_drawn(chart: dict) -> bool:
    """A chart of SHOWN_CHARTS drawn: its traces (or a note), taller than MIN_CHART_PX, as wide
    as its pane (within 2 px)."""
    return (bool(chart["traces"] or chart["note"]) and chart["height"] > MIN_CHART_PX
            and abs(chart["narrower_px"]) <= 2)


def shown_charts(page, timeout_s: float = 30, settle_s: float = 1.5) -> list[dict]:
    """The charts of the dashboard tab on show (SHOWN_CHARTS) once every one has been drawn for
    `settle_s` on end (a chart drawn and then collapsed does not count), or the last answer at the
    deadline."""
    deadline = time.monotonic() + timeout_s
    drawn_since = None
    while True:
        charts = page.evaluate(SHOWN_CHARTS)
        now = time.monotonic()
        if not (charts and all(chart_drawn(c) for c in charts)):
            drawn_since = None
        elif drawn_since is None:
            drawn_since = now
        if (drawn_since is not None and now - drawn_since >= settle_s) or now > deadline:
            return charts
        time.sleep(0.25)


def redraw_ms(page, change, quiet_s: float = 1.0, timeout_s: float = 20) -> list[float]:
    """The ms from the input event of `change()` (a function acting on the page) to each figure
    it has drawn anew (WATCH_REDRAWS), in order, once none has come for `quiet_s`; [] if none came
    by the deadline."""
    page.evaluate(WATCH_REDRAWS)
    change()
    deadline = time.monotonic() + timeout_s
    drawn, last = [], time.monotonic()
    while time.monotonic() < deadline:
        now_drawn = page.evaluate("() => window.kvlabRedraws.drawn_ms")
        if len(now_drawn) > len(drawn):
            drawn, last = now_drawn, time.monotonic()
        elif drawn and time.monotonic() - last >= quiet_s:
            break
        time.sleep(0.1)
    return drawn
