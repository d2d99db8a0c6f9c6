"""How fast the dashboard is to meet: `python benchmarks/dashboard.py [--json PATH]`.

Three numbers, against the targets of the dashboard's issue:
- `kvlab.dashboard()` in plain Python, a fresh process each time (imports included): <= 2 s;
  it builds the first tab, and each other tab when first selected: the time of that (selecting
  each tab in turn, in the same process) is recorded beside it, with no target;
- first chart in a fresh kernel: from running `import kvlab; kvlab.dashboard()` in a new
  notebook in JupyterLab (Chromium) to the first chart drawn with its data: <= 8 s;
- a slider change to its chart redrawn in the page (the paged-cache block size, one step right
  or left), median: <= 300 ms; the time to the first of the tab's three charts drawn anew, and
  to the last (no target), are recorded apart.
Needs JupyterLab, Debian's Chromium and Playwright's Python package (as the browser tests do;
`tests/browser_lab.py` drives them). Prints min / median / max of each and writes JSON.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from browser_lab import CHROMIUM, NOTEBOOK, TOKEN, jupyterlab, redraw_ms  # noqa: E402

TARGETS_S = {"dashboard_python_s": 2.0, "first_chart_s": 8.0, "redraw_s": 0.3}
PAGED_CACHE_CHARTS = ("memory", "fragmentation", "block_table")  # a block_size step redraws all
FIRST_CHART = """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
    .some(el => el.data && el.data.length && el._fullLayout)"""


DASHBOARD_IN_PYTHON = """import json, time
t = time.perf_counter()
import kvlab
dash = kvlab.dashboard()
times = {"dashboard": time.perf_counter() - t}
for index, tab in enumerate(dash.tabs[1:], 1):
    t = time.perf_counter()
    dash.tab_widget.selected_index = index
    times[tab.title] = time.perf_counter() - t
print(json.dumps(times))"""


def dashboard_in_python(runs: int) -> list[dict[str, float]]:
    """Per run (a fresh process): {"dashboard": seconds of `kvlab.dashboard()` with the imports,
    then each other tab's title: seconds of its first selection}."""
    env = {"KVLAB_BACKEND": "sim", "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return [json.loads(subprocess.run([sys.executable, "-c", DASHBOARD_IN_PYTHON],
                                      capture_output=True, text=True, env=env,
                                      check=True).stdout) for _ in range(runs)]


def notebook(folder: Path, name: str) -> None:
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": "import kvlab\nkvlab.dashboard()"}
    (folder / name).write_text(json.dumps({
        "cells": [cell], "metadata": {"kernelspec": {"name": "python3", "language": "python",
                                                     "display_name": "Python 3"}},
        "nbformat": 4, "nbformat_minor": 5}))


def in_the_browser(runs: int, redraws: int) -> tuple[list[float], list[list[float]]]:
    """Seconds to the first chart, a fresh kernel per run; and per slider step (in the first
    run), the seconds from the key press to each chart it drew anew, in order."""
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="kvlab-dashboard-bench-"))
    first, redraw = [], []
    with jupyterlab(folder) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for run in range(runs):  # a new notebook, so a fresh kernel, each run
            notebook(folder, f"dashboard{run}.ipynb")
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.goto(f"{url}/lab/tree/dashboard{run}.ipynb?token={TOKEN}")
            page.wait_for_function(f"() => {NOTEBOOK} && {NOTEBOOK}.sessionContext && "
                                   f"{NOTEBOOK}.sessionContext.session && {NOTEBOOK}"
                                   ".sessionContext.session.kernel.status === 'idle'",
                                   timeout=120_000)
            start = time.perf_counter()
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(FIRST_CHART, timeout=120_000, polling="raf")
            first.append(time.perf_counter() - start)
            if run == 0:
                handle = page.locator(".widget-slider:has-text('block_size') .noUi-handle").first
                handle.focus()
                for i in range(redraws):
                    key = "ArrowRight" if i % 2 == 0 else "ArrowLeft"
                    drawn = redraw_ms(page, partial(page.keyboard.press, key))
                    if len(drawn) != len(PAGED_CACHE_CHARTS):
                        raise RuntimeError(f"a block_size step drew {len(drawn)} charts anew: "
                                           f"expected {len(PAGED_CACHE_CHARTS)}")
                    redraw.append([ms / 1000 for ms in drawn])
            page.close()
        browser.close()
    return first, redraw


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values),
            "runs": values}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--redraws", type=int, default=20)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvlab.bench.env import run_info

    python = dashboard_in_python(args.runs)
    first, redraw = in_the_browser(max(args.runs // 2, 1), args.redraws)
    result = {"benchmark": "dashboard", **run_info(),
              "command": " ".join(["python benchmarks/dashboard.py", *sys.argv[1:]]),
              "chromium": CHROMIUM,
              "dashboard_python_s": summary([run.pop("dashboard") for run in python]),
              "tab_first_view_s": {title: summary([run[title] for run in python])
                                   for title in python[0]},
              "first_chart_s": summary(first),
              "redraw_s": summary([drawn[0] for drawn in redraw]),
              "redraw_all_s": summary([drawn[-1] for drawn in redraw]),
              "targets_s": TARGETS_S}
    for key in (*TARGETS_S, "redraw_all_s"):
        s, target = result[key], TARGETS_S.get(key)
        verdict = "no target" if target is None else (
            f"{'meets' if s['median'] <= target else 'MISSES'} the {target:g} s target")
        print(f"{key:20} min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f} s "
              f"({len(s['runs'])} runs; {verdict})")
    for title, s in result["tab_first_view_s"].items():
        print(f"first view of {title}: min {s['min']:.3f}  median {s['median']:.3f}  "
              f"max {s['max']:.3f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
