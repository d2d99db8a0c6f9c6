"""The whole dashboard as a browser gets it: every figure's data is valid JSON (CPU)."""

from factories import non_finite_paths

import kvlab


def test_every_figure_of_every_tab_can_be_sent_to_the_browser(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    dashboard = kvlab.dashboard()
    for tab, figures in dashboard.figures.items():
        for name, figure in figures.items():
            assert non_finite_paths(figure.to_plotly_json()) == [], (tab, name)
