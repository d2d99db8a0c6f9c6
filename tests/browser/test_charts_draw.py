"""Charts that always draw, in JupyterLab in Chromium: every chart of the dashboard's shown tab is
drawn with its traces, taller than 100 px, and stays so, in a new notebook of just
`import kvlab; kvlab.dashboard()`; after a control redrew it and another tab was shown in
between; after a page reload; and after the saved notebook was closed and opened again. Prints
the median time from a control change to its charts drawn anew (issue 49 asks for <= 300 ms).

Needs Debian's Chromium (KVLAB_CHROMIUM, default /usr/bin/chromium) and Playwright's Python
package; skipped without them."""

import re
import statistics
import tempfile
from pathlib import Path

import pytest
from browser_lab import (
    BROWSER_TEST,
    CHROMIUM,
    NOTEBOOK,
    TOKEN,
    chart_drawn,
    jupyterlab,
    new_notebook,
    redraw_ms,
    run_all,
    shown_charts,
)

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = BROWSER_TEST
NAME = "dashboard.ipynb"
# (tab, control's description, new value): a slider's value is the key that moves it, a number
# box's the number typed into it, a dropdown's the option's label
CHANGES = [
    ("Paged cache", "block_size (tokens)", "ArrowRight"),
    ("Paged cache", "model", "llama2-7b"),
    ("Paged cache", "length distribution", "uniform"),
    ("Decode kernels", "kernel family", "gqa"),
    ("Decode kernels", "batch", "24"),
    ("Decode kernels", "context (tokens)", "5000"),
    ("Decode kernels", "KV heads", "4"),
    ("Decode kernels", "block_size (tokens)", "64"),
    ("Decode kernels", "GPU", "NVIDIA H20"),
    ("Decode kernels", "KV cache dtype", "fp8"),
    ("KVPR", "schedule", "column"),
    ("KVPR", "weights", "offloaded"),
    ("KVPR", "GPU", "NVIDIA A100-PCIE-40GB"),
    ("L2 and counters", "kernel family", "gqa"),
    ("L2 and counters", "context (tokens)", "8192"),
    ("L2 and counters", "GPU", "NVIDIA H20"),
    ("End-to-end", "batch", "16"),
    ("End-to-end", "GPU", "NVIDIA H100 80GB HBM3"),
]


@pytest.fixture(scope="module")
def lab():
    """A new notebook of `import kvlab; kvlab.dashboard()` run in Chromium, at 1,280 px."""
    folder = Path(tempfile.mkdtemp(prefix="kvlab-charts-"))
    new_notebook(folder, NAME, "import kvlab; kvlab.dashboard()")
    with jupyterlab(folder) as url, playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        page.goto(f"{url}/lab/tree/{NAME}?token={TOKEN}")
        run_all(page)
        yield page
        browser.close()


def tab(page, title: str):
    return page.locator(".widget-tab").get_by_role("tab", name=title, exact=True)


def assert_drawn(charts: list[dict], where: str) -> None:
    assert charts, f"{where}: no chart on show"
    assert all(chart_drawn(c) for c in charts), f"{where}: charts not drawn: {charts}"


def change(page, description: str, value: str):
    """The action that sets the control of `description` on the shown tab to `value`."""
    label = page.get_by_text(re.compile(f"^{re.escape(description)}$"))
    control = page.locator(".widget-tab :is(.widget-inline-hbox, .widget-toggle-buttons):visible"
                           ).filter(has=label).first
    classes = control.get_attribute("class")
    if "widget-slider" in classes:
        control.locator(".noUi-handle").first.focus()
        return lambda: page.keyboard.press(value)
    if "widget-toggle-buttons" in classes:
        return lambda: control.locator("button", has_text=value).click()
    if "widget-text" in classes:  # a number box: its value is sent on Enter
        box = control.locator("input")

        def type_number():
            box.fill(value)
            box.press("Enter")

        return type_number
    return lambda: control.locator("select").select_option(label=value)


def test_a_new_notebook_draws_every_chart_of_its_shown_tab(lab):
    assert_drawn(shown_charts(lab), "a new notebook")


def test_a_chart_a_control_redrew_is_drawn_when_its_tab_is_shown_again(lab):
    """Each control change draws its tab's charts anew; then another tab is shown, and this one
    again. Prints the median time from a change to the first, and to the last, of its charts
    drawn anew."""
    page, first_ms, last_ms, blank = lab, [], [], []
    for title, description, value in CHANGES:
        tab(page, title).click()
        try:
            act = change(page, description, value)
        except playwright.Error as error:
            raise AssertionError(f"{title}: no control {description!r} on show") from error
        drawn = redraw_ms(page, act)
        assert drawn, f"{title}: {description}={value} drew no chart"
        first_ms.append(drawn[0])
        last_ms.append(drawn[-1])
        tab(page, "KVPR" if title != "KVPR" else "Paged cache").click()
        tab(page, title).click()
        charts = shown_charts(page)
        if not all(chart_drawn(c) for c in charts):
            blank.append(f"{title} after {description}={value}: {charts}")
    print(f"a control change to its first chart drawn: median {statistics.median(first_ms):.0f} "
          f"ms; to its last: median {statistics.median(last_ms):.0f} ms "
          f"(max {max(last_ms):.0f} ms, {len(CHANGES)} changes; issue 49: <= 300 ms)")
    assert not blank, "charts not drawn when their tab was shown again:\n" + "\n".join(blank)


def test_a_reload_and_a_reopened_notebook_draw_the_shown_tab(lab):
    page = lab
    page.keyboard.press("Control+s")
    page.wait_for_function(f"() => !{NOTEBOOK}.context.model.dirty", timeout=30_000)
    page.reload()
    page.wait_for_selector(".widget-tab .js-plotly-plot", state="attached", timeout=90_000)
    assert_drawn(shown_charts(page), "after a reload")
    page.evaluate("window.jupyterapp.commands.execute('application:close')")
    page.wait_for_selector(".widget-tab", state="detached", timeout=30_000)
    page.evaluate(f"window.jupyterapp.commands.execute('docmanager:open', {{path: '{NAME}'}})")
    page.wait_for_selector(".widget-tab .js-plotly-plot", state="attached", timeout=90_000)
    assert_drawn(shown_charts(page), "after the saved notebook was closed and opened again")
