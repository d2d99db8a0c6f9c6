"""The "Paged cache" tab, driven without a browser: set a control, check the figures' data."""

import numpy as np
import pytest

from kvlab.cache.accounting import fragmentation_sweep, memory_report, replay_block_tables
from kvlab.config import MODELS
from kvlab.panels import Dashboard, dashboard
from kvlab.viz.cache import GIB
from kvlab.workload import make_workload


@pytest.fixture
def dash(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    return dashboard()


def expected_report(controls):
    """The memory report computed directly from the controls' values, bypassing the tab."""
    v = {name: c.value for name, c in controls.items()}
    model = MODELS[v["model"]]
    workload = make_workload(
        v["distribution"],
        v["num_requests"],
        model.max_position,
        v["shared_fraction"],
        v["prefix_len"],
        num_prefixes=2,
    )
    bytes_per_token = model.kv_bytes_per_token(2)
    report = memory_report(
        workload, bytes_per_token, v["block_size"], budget_bytes=int(v["budget_gib"] * GIB)
    )
    return workload, bytes_per_token, report


def assert_memory_figure_shows(fig, report):
    paged_reserved, paged_holding, contiguous_reserved, contiguous_holding = fig.data
    reserved = [*paged_reserved.y, *contiguous_reserved.y]
    holding = [*paged_holding.y, *contiguous_holding.y]
    assert reserved == pytest.approx(
        [report.paged.reserved_bytes / GIB, report.contiguous.reserved_bytes / GIB]
    )
    assert holding == pytest.approx(
        [report.paged.token_bytes / GIB, report.contiguous.token_bytes / GIB]
    )


def test_dashboard_layout_and_header(dash):
    assert isinstance(dash, Dashboard)
    assert "sim" in dash.header.value and "simulated backend" in dash.header.value
    assert list(dash.controls) == list(dash.figures) == ["paged_cache", "decode_kernels", "kvpr",
                                                         "l2", "e2e"]
    assert dash.tab_widget.titles == ("Paged cache", "Decode kernels", "KVPR", "L2 and counters",
                                      "End-to-end")
    assert set(dash.figures["paged_cache"]) == {"memory", "fragmentation", "block_table"}
    assert all(f.figure.layout.height for f in dash.figures["paged_cache"].values())
    sliders = [c for c in dash.controls["paged_cache"].values() if hasattr(c, "continuous_update")]
    assert sliders and not any(c.continuous_update for c in sliders)
    assert "application/vnd.jupyter.widget-view+json" in dash._repr_mimebundle_()


def test_initial_figures_match_direct_computation(dash):
    controls, figures = dash.controls["paged_cache"], dash.figures["paged_cache"]
    _, _, report = expected_report(controls)
    assert_memory_figure_shows(figures["memory"].figure, report)


def test_block_size_change_updates_every_figure(dash):
    controls, figures = dash.controls["paged_cache"], dash.figures["paged_cache"]
    before = figures["memory"].figure.data[0].y
    controls["block_size"].value = 128
    workload, bytes_per_token, report = expected_report(controls)
    assert report.block_size == 128
    assert_memory_figure_shows(figures["memory"].figure, report)
    assert figures["memory"].figure.data[0].y[0] > before[0]  # bigger blocks reserve more
    current = figures["fragmentation"].figure.data[3]
    sweep = fragmentation_sweep(workload, bytes_per_token)
    assert list(current.x) == [128]
    assert current.y[0] == pytest.approx(sweep.fragmentation_pct[sweep.block_sizes == 128][0])
    block_tables, _ = replay_block_tables(workload, 128, max_requests=24)
    assert np.array(figures["block_table"].figure.data[0].z, dtype=float).shape == (
        24, max(map(len, block_tables)))


def test_shared_fraction_makes_shared_blocks_appear(dash):
    controls, figures = dash.controls["paged_cache"], dash.figures["paged_cache"]
    shared = np.array(figures["block_table"].figure.data[1].z, dtype=float)
    assert np.isnan(shared).all()  # no shared prefix: no shared block
    paged_before = figures["memory"].figure.data[0].y[0]
    controls["shared_fraction"].value = 0.5
    _, _, report = expected_report(controls)
    assert_memory_figure_shows(figures["memory"].figure, report)
    assert report.num_shared_blocks > 0
    assert not np.isnan(np.array(figures["block_table"].figure.data[1].z, dtype=float)).all()
    # A 1000-token prefix is added to half the requests, yet paged stores each prefix once.
    memory = figures["memory"].figure
    paged_holding, contiguous_holding = memory.data[1], memory.data[3]
    assert paged_holding.y[0] < contiguous_holding.y[0]
    assert paged_before < figures["memory"].figure.data[0].y[0]


def test_num_requests_and_budget_change_the_fit(dash):
    controls, figures = dash.controls["paged_cache"], dash.figures["paged_cache"]
    controls["num_requests"].value = 900
    controls["budget_gib"].value = 10.0
    _, _, report = expected_report(controls)
    assert report.num_requests == 900
    assert_memory_figure_shows(figures["memory"].figure, report)
    title = figures["memory"].figure.layout.title.text
    assert f"paged {report.paged.num_requests_fit} / 900" in title
    assert f"contiguous {report.contiguous.num_requests_fit} / 900 requests" in title
    assert np.isclose(figures["memory"].figure.layout.shapes[0].y0, 10.0)


def test_model_change_rescales_bytes_and_prefix_range(dash):
    controls, figures = dash.controls["paged_cache"], dash.figures["paged_cache"]
    controls["model"].value = "tiny-llama"
    assert controls["prefix_len"].max == MODELS["tiny-llama"].max_position // 2
    assert controls["prefix_len"].value <= controls["prefix_len"].max
    controls["shared_fraction"].value = 1.0
    controls["distribution"].value = "uniform"
    _, _, report = expected_report(controls)
    assert report.max_seq_len == MODELS["tiny-llama"].max_position
    assert_memory_figure_shows(figures["memory"].figure, report)


def test_kvlab_dashboard_is_callable_after_the_panels_are_imported(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    import kvlab
    import kvlab.panels.paged_cache  # noqa: F401

    assert isinstance(kvlab.dashboard(), Dashboard)


def test_the_kv_budget_redraws_the_memory_chart_only_and_block_size_all_three(dash):
    figures, controls = dash.figures["paged_cache"], dash.controls["paged_cache"]
    sent = []
    for name, pane in figures.items():
        pane.observe(lambda change, name=name: sent.append(name), names="outputs")
    controls["budget_gib"].value = 20.0  # the fragmentation and block tables do not change
    assert sent == ["memory"]
    sent.clear()
    controls["block_size"].value = 32
    assert sent == ["memory", "fragmentation", "block_table"]
