"""The walkthrough as a person meets it: JupyterLab in Chromium runs every cell; no cell errs or
writes to stderr, the page logs no error, every Plotly figure has data, a dashboard control
changes its chart in the page, every chart of each dashboard tab is drawn when the tab is shown
(at 1,280 and 1,000 px, and after a reload), and a reload brings every figure back with its data.
Screenshots of each dashboard tab at 1,280 and 1,000 px wide go to build/browser/
(KVLAB_ARTIFACTS).

Needs Debian's Chromium (KVLAB_CHROMIUM, default /usr/bin/chromium) and Playwright's Python
package; skipped without them. `.ci/run` installs both."""

import tempfile
import time
from pathlib import Path

import pytest
from browser_lab import (
    ARTIFACTS,
    BROWSER_TEST,
    CELL_PROBLEMS,
    CHROMIUM,
    PLOTS,
    TOKEN,
    WIDTHS,
    chart_drawn,
    copy_notebook,
    jupyterlab,
    run_all,
    shown_charts,
    wait_for_plots,
)

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = BROWSER_TEST
TABS = ("Paged cache", "Decode kernels", "KVPR", "L2 and counters", "End-to-end")
# console messages that are not the page's errors: resources a fresh server lacks
NOT_ERRORS = ("Failed to load resource",)


@pytest.fixture(scope="module")
def walkthrough():
    """The walkthrough run to the end in Chromium: (page, console errors), at 1,280 px."""
    folder = Path(tempfile.mkdtemp(prefix="kvlab-browser-"))
    copy_notebook(folder)
    with jupyterlab(folder) as url, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": WIDTHS[0], "height": 1000})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and not any(
            m.text.startswith(n) for n in NOT_ERRORS) else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/lab/tree/walkthrough.ipynb?token={TOKEN}")
        started = time.monotonic()
        run_all(page)
        print(f"walkthrough ran in {time.monotonic() - started:.0f} s")
        yield page, errors
        browser.close()


def test_every_cell_runs_without_an_error_or_stderr(walkthrough):
    page, _ = walkthrough
    assert page.evaluate(CELL_PROBLEMS) == []


def test_every_figure_has_data_and_the_page_logs_no_error(walkthrough):
    page, errors = walkthrough
    plots = wait_for_plots(page)
    assert len(plots) >= 10
    empty = [i for i, p in enumerate(plots) if not p["note"] and not (p["traces"] and p["points"])]
    assert not empty, f"figures without data or a note: {empty} of {len(plots)}"
    # notes, not data: the End-to-end tab's tensor-parallel chart (no run of several GPUs) and
    # its traced step (traced on an H100, not on the H200 the tab shows)
    assert sum(p["note"] for p in plots) <= 2
    assert errors == []


def dashboard(page):
    """The dashboard's output area (the last cell's)."""
    return page.locator(".jp-Cell").last.locator(".jp-OutputArea-output").first


def test_a_block_size_change_changes_the_charts_in_the_page(walkthrough):
    page, _ = walkthrough
    out = dashboard(page)
    out.get_by_role("tab", name=TABS[0]).click()
    before = page.evaluate(PLOTS)
    slider = out.locator(".widget-slider:has-text('block_size')").first
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")  # the next block size
    deadline = time.monotonic() + 20
    while page.evaluate(PLOTS) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert page.evaluate(PLOTS) != before


def test_screenshots_of_each_tab(walkthrough):
    page, _ = walkthrough
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 2400})  # the whole dashboard
        out = dashboard(page)
        for tab in TABS:
            out.get_by_role("tab", name=tab).click()
            charts = shown_charts(page)  # fitted to the new width
            assert all(chart_drawn(c) for c in charts), (tab, width, charts)
            path = ARTIFACTS / f"dashboard-{tab.lower().replace(' ', '-')}-{width}.png"
            out.screenshot(path=path)
            assert path.stat().st_size > 10_000


@pytest.mark.parametrize(("control", "value", "first", "name", "title"), [
    ("batch lengths", "lognormal:1536,2048", "equal", "mixed", "Mixed lengths"),
    ("KV blocks", "in order", "scattered", "blocks-in-order", "Blocks in order"),
])
def test_a_view_control_changes_the_kernels_charts_in_the_page(walkthrough, control, value,
                                                                first, name, title):
    """The Decode kernels tab's batch-lengths and KV-blocks controls draw their views
    (screenshots dashboard-decode-kernels-<name>-1280.png), and their first value brings the
    first view back."""
    page, _ = walkthrough
    page.set_viewport_size({"width": WIDTHS[0], "height": 2400})
    out = dashboard(page)
    out.get_by_role("tab", name=TABS[1]).click()
    select = out.locator(f".widget-dropdown:has-text('{control}') select").first
    for option, shot in ((value, name), (first, None)):
        before = page.evaluate(PLOTS)
        select.select_option(option)
        deadline = time.monotonic() + 20
        while page.evaluate(PLOTS) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert page.evaluate(PLOTS) != before, option
        if shot:
            charts = shown_charts(page)
            assert all(chart_drawn(c) for c in charts), (option, charts)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            path = ARTIFACTS / f"dashboard-decode-kernels-{shot}-{WIDTHS[0]}.png"
            out.screenshot(path=path)
            assert title in out.inner_text()


STATIC_FIGURES = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))
    .filter(out => !out.closest('.widget-tab') && !out.querySelector('.widget-tab'))
    .filter(out => out.querySelector('.js-plotly-plot, img')).length"""


def test_a_reload_brings_every_figure_back_with_its_data(walkthrough):
    """The dashboard's charts come back live, with their data; the notebook's own figures come
    back too (JupyterLab may draw a reloaded notebook's figure from its static image)."""
    page, errors = walkthrough
    before = page.evaluate(PLOTS)
    live = sum(p["in_dashboard"] for p in before)
    static = page.evaluate(STATIC_FIGURES)
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty",
                           timeout=30_000)
    page.reload()
    page.wait_for_selector(".widget-tab", timeout=90_000)
    out = dashboard(page)
    for tab in TABS:  # a tab's charts are drawn when it is first shown
        out.get_by_role("tab", name=tab).click()
        charts = shown_charts(page)
        assert all(chart_drawn(c) for c in charts), (tab, charts)
    plots = [p for p in wait_for_plots(page, timeout_s=90) if p["in_dashboard"]]
    assert len(plots) == live == 17
    empty = [i for i, p in enumerate(plots) if not p["note"] and not (p["traces"] and p["points"])]
    assert not empty, f"dashboard charts without data after a reload: {empty} of {live}"
    assert page.evaluate(STATIC_FIGURES) == static >= 10
    assert errors == []
