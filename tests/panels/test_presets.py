"""Every model preset, recorded or not, in every tab: each figure has data or a note, strict JSON
(no NaN or Infinity reaches the browser), and a title that says where its numbers came from."""

import json

import plotly.io as pio
import pytest

import kvlab
from kvlab.config import MODELS
from kvlab.gpus import GPUS, REFERENCE

PROVENANCE = ("recorded on ", "computed exactly from block accounting", "modelled with ",
              "measured on ", "the paper's figures: ", "modelled by kvlab.sim",
              "not recorded on the H200", "modelled: ", "modelled for ",
              "not measured, not modelled", "not traced, not modelled")


def strict_json(figure) -> dict:
    """The figure as plotly sends it, parsed refusing NaN and +-Infinity."""

    def refuse(constant):
        raise ValueError(f"{constant} in the figure's JSON: not JSON compliant")

    return json.loads(pio.to_json(figure, validate=True, engine="json"), parse_constant=refuse)


def check_figures(figures: dict) -> None:
    for name, pane in figures.items():
        spec = strict_json(pane.figure)
        json.dumps(pane.outputs, allow_nan=False)  # what the browser gets
        layout = spec["layout"]
        notes = [a["text"] for a in layout.get("annotations", []) if a.get("text")]
        assert spec["data"] or notes, f"{name}: neither data nor a note"
        title = layout["title"]["text"]
        assert any(p in title for p in PROVENANCE), f"{name}: no provenance in {title!r}"
        assert not layout.get("width") and layout["autosize"] is True, name


@pytest.fixture(scope="module")
def dash():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVLAB_BACKEND", "sim")
        yield kvlab.dashboard()


def test_every_tab_at_its_defaults(dash):
    for figures in dash.figures.values():
        check_figures(figures)


@pytest.mark.parametrize("model", list(MODELS))
def test_every_preset_in_every_tab(dash, model):
    for key, controls in dash.controls.items():
        controls["model"].value = model
        check_figures(dash.figures[key])


def test_a_context_past_the_models_maximum_is_noted_not_clamped(dash):
    controls = dash.controls["kvpr"]
    controls["model"].value = "tiny-llama"
    controls["context"].value = 4096
    assert controls["context"].value == 4096
    kvpr = next(tab for tab in dash.tabs if tab.key == "kvpr")
    note = "context 4096 is past the maximum of tiny-llama (512 tokens): modelled anyway"
    assert note in kvpr.status.value
    assert note in dash.figures["kvpr"]["split"].figure.layout.title.text


@pytest.mark.parametrize("gpu", list(GPUS))
def test_every_gpu_in_every_tab_that_models_one(dash, gpu):
    """The Decode kernels, L2, KVPR and End-to-end tabs each offer every GPU of kvlab.gpus;
    another GPU than the H200 is never shown as measured or recorded there."""
    tabs = {key: controls for key, controls in dash.controls.items() if "gpu" in controls}
    assert set(tabs) == {"decode_kernels", "l2", "kvpr", "e2e"}
    for key, controls in tabs.items():
        controls["gpu"].value = gpu
        check_figures(dash.figures[key])
        if gpu != REFERENCE:
            name = GPUS[gpu].name
            titles = [pane.figure.layout.title.text for pane in dash.figures[key].values()]
            assert any(f"modelled for {name}" in t for t in titles), (key, titles)
        controls["gpu"].value = REFERENCE
