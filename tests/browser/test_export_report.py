"""The dashboard's export as a person opens it, in Chromium: each tab's HTML report, opened from
disk with the network cut off, draws every bar and line where its axes say (Plotly's own axis
conversion against the drawn SVG, within 1.5 px) at 1,280 and 1,000 px; and in JupyterLab the
"Export this tab" label is whole and the report's link opens it in a tab of its own, charts
drawn, with no "Trust HTML" step.

Needs Debian's Chromium (KVLAB_CHROMIUM, default /usr/bin/chromium) and Playwright's Python
package; skipped without them."""

import json
import tempfile
from pathlib import Path

import pytest
from browser_lab import BROWSER_TEST, CHROMIUM, TOKEN, WIDTHS, jupyterlab, run_all

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = BROWSER_TEST
TOLERANCE_PX = 1.5

# In-page, on one Plotly figure (gd): each bar's and each line trace's box as drawn (the SVG
# path's bounding box, from the figure's top left) beside where Plotly's axis conversion puts its
# data: l2p of the value, from the plot area's edge (the margins and the axis's domain; not the
# axis's own offset, which the data layer may not share). A bar spans [base, base + value] of its
# size axis and Plotly's [p0, p1] of its position axis; a line, its data's least and greatest x, y.
DRAWN_AND_WANTED = """(gd) => {
  const fl = gd._fullLayout, size = fl._size;
  const paper = gd.querySelector('.main-svg').getBoundingClientRect();
  const axis = (id) => fl[id[0] + 'axis' + id.slice(1)];
  const px = (ax, lin) => ax._id[0] === 'x'
      ? ax.l2p(lin) + size.l + ax.domain[0] * size.w
      : ax.l2p(lin) + size.t + (1 - ax.domain[1]) * size.h;
  const values = (v) => Array.from(v._inputArray || v);  // numpy arrays come typed
  const box = (el) => { const b = el.getBoundingClientRect(), x = paper.left, y = paper.top;
      return [b.left - x, b.top - y, b.right - x, b.bottom - y]; };
  const ordered = (x0, y0, x1, y1) =>
      [Math.min(x0, x1), Math.min(y0, y1), Math.max(x0, x1), Math.max(y0, y1)];
  const out = [];
  gd.querySelectorAll('.barlayer .trace.bars').forEach(g => {
    const trace = g.__data__[0].trace;
    if (trace.visible !== true) return;
    const horizontal = trace.orientation === 'h';
    const sa = axis(horizontal ? trace.xaxis : trace.yaxis);
    const pa = axis(horizontal ? trace.yaxis : trace.xaxis);
    const lengths = values(horizontal ? trace.x : trace.y);
    const bases = trace.base == null ? null
        : typeof trace.base === 'number' ? trace.base : values(trace.base);
    g.querySelectorAll('.point').forEach(point => {
      const d = point.__data__, path = point.querySelector('path');
      const base = bases === null ? 0 : typeof bases === 'number' ? bases : bases[d.i];
      const length = lengths[d.i];
      if (!Number.isFinite(length) || !Number.isFinite(base) || !path) return;
      if (!path.getAttribute('d') || path.getAttribute('d') === 'M0,0Z') return;  // not drawn
      const s0 = px(sa, sa.c2l(base)), s1 = px(sa, sa.c2l(base + length));
      const p0 = px(pa, d.p0), p1 = px(pa, d.p1);
      out.push({kind: 'bar', trace: trace.name, index: d.i, base, length, drawn: box(path),
                wanted: horizontal ? ordered(s0, p0, s1, p1) : ordered(p0, s0, p1, s1)});
    });
  });
  gd.querySelectorAll('.scatterlayer .trace').forEach(g => {
    const trace = g.__data__[0].trace;
    if (trace.visible !== true || !trace.mode.includes('lines')) return;
    const paths = Array.from(g.querySelectorAll('path.js-line')).filter(p => p.getAttribute('d'));
    if (!paths.length) return;
    const xa = axis(trace.xaxis), ya = axis(trace.yaxis);
    const xs = values(trace.x).filter(Number.isFinite).map(v => px(xa, xa.c2l(v)));
    const ys = values(trace.y).filter(Number.isFinite).map(v => px(ya, ya.c2l(v)));
    const boxes = paths.map(box);
    out.push({kind: 'line', trace: trace.name,
              drawn: [Math.min(...boxes.map(b => b[0])), Math.min(...boxes.map(b => b[1])),
                      Math.max(...boxes.map(b => b[2])), Math.max(...boxes.map(b => b[3]))],
              wanted: ordered(Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys))});
  });
  return out;
}"""
DRAWN = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).every(
    gd => gd._fullLayout && gd.querySelector('.main-svg'))"""
NEXT_FRAMES = "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"


def off_axis(page) -> dict[str, dict]:
    """{chart name (the report's h2): {"checked": number of bars and lines, "off": those drawn
    more than TOLERANCE_PX from where their axes put them}}, for every chart on the page."""
    page.wait_for_function(DRAWN, timeout=30_000)
    page.evaluate(NEXT_FRAMES)  # the second draw of each figure (kvlab.viz.export) done
    names = page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
    found = {}
    for k, name in enumerate(names):
        marks = page.evaluate(f"() => ({DRAWN_AND_WANTED})("
                              f"document.querySelectorAll('.js-plotly-plot')[{k}])")
        off = [m for m in marks if max(abs(a - b) for a, b in zip(m["drawn"], m["wanted"],
                                                                   strict=True)) > TOLERANCE_PX]
        found[name] = {"checked": len(marks), "off": off[:3]}
    return found


@pytest.fixture(scope="module")
def reports():
    """{tab key: its HTML report}, every tab of the dashboard on the simulated backend exported
    as the button does."""
    folder = Path(tempfile.mkdtemp(prefix="kvlab-export-"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_BACKEND", "sim")
        import kvlab

        dash = kvlab.dashboard()
        found = {}
        for index, tab in enumerate(dash.tabs):
            dash.tab_widget.selected_index = index
            found[tab.key] = dash.export(folder=folder / tab.key)[-1]
    return found


@pytest.fixture(scope="module")
def chromium():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_every_bar_and_line_of_every_report_is_drawn_on_its_axes_offline(reports, chromium,
                                                                         width):
    requests, errors = [], []
    page = chromium.new_page(viewport={"width": width, "height": 1000})
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the network cut off: a report must hold everything it needs (plotly.js, no CDN)
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
        "file:") else (requests.append(route.request.url), route.abort()))
    checked = {}
    try:
        for key, report in reports.items():
            page.goto(report.as_uri())
            for name, found in off_axis(page).items():
                checked[f"{key}/{name}"] = found["checked"]
                assert found["off"] == [], f"{key}/{name} at {width} px: drawn off its axes"
    finally:
        page.close()
    assert requests == [] and errors == []
    # the charts the offset was found on: vertical bars, and the timelines (bars from a base;
    # lines of subplots sharing an axis)
    for chart in ("paged_cache/memory", "decode_kernels/speedup", "kvpr/overlap",
                  "decode_kernels/timeline"):
        assert checked[chart] > 0, chart


NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "id": "dashboard", "metadata": {},
               "outputs": [], "source": ["import kvlab\n", "kvlab.dashboard()"]}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}
BUTTON = """() => { const b = Array.from(document.querySelectorAll('button.widget-button'))
    .find(e => e.textContent.includes('Export'));
  return b && {text: b.textContent.trim(), scroll: b.scrollWidth, client: b.clientWidth}; }"""


@pytest.fixture(scope="module")
def lab(chromium):
    """A notebook showing the dashboard, run in JupyterLab: (page, the server's root folder)."""
    folder = Path(tempfile.mkdtemp(prefix="kvlab-browser-export-"))
    (folder / "export.ipynb").write_text(json.dumps(NOTEBOOK))
    with jupyterlab(folder) as url:
        page = chromium.new_page(viewport={"width": WIDTHS[0], "height": 1000})
        page.goto(f"{url}/lab/tree/export.ipynb?token={TOKEN}")
        run_all(page)
        page.wait_for_function(f"() => ({BUTTON})() !== undefined", timeout=60_000)
        yield page, folder
        page.close()


REPORT_LINK = """() => { const a = document.querySelector('a[href$="paged_cache.html"]');
  return a && a.getAttribute('href'); }"""


def export(page):
    """Click "Export this tab" (the "Paged cache" tab shown): the report's link once the message
    shows this export's."""
    old = page.evaluate(REPORT_LINK)
    page.get_by_role("button", name="Export this tab").click()
    page.wait_for_function(f"() => {{ const href = ({REPORT_LINK})(); "
                           f"return href && href !== {json.dumps(old)}; }}", timeout=30_000)
    return page.locator("a", has_text="paged_cache.html")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_export_buttons_label_is_whole_before_and_beside_the_exports_message(lab, width):
    page, _ = lab
    page.set_viewport_size({"width": width, "height": 1000})
    page.evaluate(NEXT_FRAMES)
    before = page.evaluate(BUTTON)
    # the message after an export (a full path and links) takes the row's width: the button
    # beside it was squeezed to "Export this ..."
    export(page)
    page.evaluate(NEXT_FRAMES)
    beside = page.evaluate(BUTTON)
    for button in (before, beside):
        assert button["text"] == "Export this tab"
        assert button["scroll"] <= button["client"], f"label cut at {width} px: {button}"


def test_the_reports_link_opens_it_in_a_tab_of_its_own_with_its_charts(lab):
    page, folder = lab
    page.set_viewport_size({"width": WIDTHS[0], "height": 1000})
    link = export(page)
    message = link.locator("xpath=ancestor::span[1]").inner_text()
    assert f"exported to {folder / 'kvlab-export'}/" in message  # the full path
    assert link.get_attribute("href").startswith("/files/kvlab-export/")
    with page.context.expect_page() as opened:
        link.click()
    report = opened.value
    report.wait_for_load_state()
    try:
        assert "/files/kvlab-export/" in report.url and report.url.endswith("paged_cache.html")
        assert report.locator("h1").inner_text() == "kvlab: Paged cache"
        assert report.locator(".jp-LabShell").count() == 0  # a plain tab, not JupyterLab's viewer
        found = off_axis(report)
        assert len(found) == 3 and found["memory"]["checked"] > 0
        assert all(f["off"] == [] for f in found.values()), found
    finally:
        report.close()
