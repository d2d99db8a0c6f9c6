"""Every control of every dashboard tab changes what its tab draws: set to another value it
offers, at least one of the tab's charts is drawn anew with other content (CPU, "sim" backend).
A control that changed only the status line, or nothing, fails here."""

import json

import ipywidgets as widgets
import plotly.io as pio
import pytest

import kvlab


@pytest.fixture(scope="module")
def dash():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_BACKEND", "sim")
        yield kvlab.dashboard()


def other_value(control):
    """A value `control` offers other than its own: the next option, or a step inside its
    bounds."""
    if isinstance(control, widgets.widgets.widget_selection._Selection):
        values = [o[1] if isinstance(o, tuple) else o for o in control._options_full]
        return values[(values.index(control.value) + 1) % len(values)]
    if isinstance(control, widgets.Checkbox | widgets.ToggleButton):
        return not control.value
    low, high = control.min, control.max
    step = control.step if isinstance(control.step, int | float) and control.step else 1
    if isinstance(control.value, int):
        step = max(1, int(step), (high - low) // 8)
    else:
        step = max(step, (high - low) / 8)
    return control.value + step if control.value + step <= high else control.value - step


def drawn(tab) -> list[str]:
    return [json.dumps(json.loads(pio.to_json(p.figure, validate=False)), sort_keys=True)
            for p in tab.figures.values()]


def cases():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_BACKEND", "sim")
        return [(tab.key, name) for tab in kvlab.dashboard().tabs
                for name, control in tab.controls.items() if not control.disabled]


@pytest.mark.parametrize("key,name", cases(), ids=lambda x: x)
def test_every_control_changes_its_tabs_charts(dash, key, name):
    (tab,) = [t for t in dash.tabs if t.key == key]
    control = tab.controls[name]
    before, start = drawn(tab), control.value
    control.value = other_value(control)
    try:
        assert drawn(tab) != before, f"{key}: {name} {start!r} -> {control.value!r} redrew nothing"
    finally:
        control.value = start
