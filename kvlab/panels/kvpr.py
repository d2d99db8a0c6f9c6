"""The "KVPR" tab: the predicted decode-step time against the split point l under the paper's,
the chunked and the pipelined model of time, each optimum marked, the chosen l drawn, and the
steps measured at the nearest recorded point (`python -m kvlab bench kvpr`) on top; below, the
recorded step time of each setting against full transfer.

The models need `v_com` (PCIe GB/s) and `v_gpu` (recompute TFLOP/s). With rates "recorded" the
sliders take the rates measured with the nearest recorded point of the model; with "what-if" they
are free, and the figure's title says so.
"""

from __future__ import annotations

import contextlib
import html

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.config import MODELS
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split
from kvlab.panels.app import figure_widget, labeled, show_figure
from kvlab.results import label, load_result, nearest_point, recorded_models
from kvlab.viz.offload import settings_figure, split_figure

RECORDED = ("h200", "kvpr")
FIGURE_HEIGHTS = {"split": 420, "settings": 320}
MAX_CONTEXT = 32768


class KVPRTab:
    """controls: model, batch, context, rates ("recorded" / "what-if"), pcie_gbps,
    recompute_tflops, l, chunks. figures: split, settings (`go.FigureWidget`s)."""

    key = "kvpr"
    title = "KVPR"

    def __init__(self, model: str = "opt-6.7b", batch: int = 16, context: int = 1024):
        self.recorded = load_result(*RECORDED)
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", options=list(MODELS), value=model),
            "batch": labeled(widgets.BoundedIntText, "batch", min=1, max=1024, value=batch),
            "context": labeled(widgets.BoundedIntText, "context s' (tokens)", min=1,
                               max=MAX_CONTEXT, value=context),
            "rates": labeled(widgets.ToggleButtons, "rates", options=["recorded", "what-if"],
                             value="recorded"),
            "pcie_gbps": labeled(widgets.FloatSlider, "PCIe H2D (GB/s)", min=1.0, max=128.0,
                                 step=0.1, value=55.0, continuous_update=False),
            "recompute_tflops": labeled(widgets.FloatSlider, "recompute (TFLOP/s)", min=1.0,
                                        max=2000.0, step=1.0, value=500.0,
                                        continuous_update=False),
            "l": labeled(widgets.IntSlider, "split l (tokens)", min=0, max=context, value=0,
                         continuous_update=False),
            "chunks": labeled(widgets.IntSlider, "X chunks per layer", min=1, max=16, value=4,
                              continuous_update=False),
        }
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        c = self.controls
        self.widget = widgets.VBox([
            widgets.HBox([widgets.VBox([c["model"], c["batch"], c["context"], c["chunks"]]),
                          widgets.VBox([c["rates"], c["pcie_gbps"], c["recompute_tflops"],
                                        c["l"]])]),
            self.status, *self.figures.values(),
        ])
        self.refresh()

    def _recorded_rows(self, model: str, batch: int, context: int) -> list[dict]:
        if model not in recorded_models(self.recorded):
            return []
        b, c = nearest_point(self.recorded, model, batch, context)
        return [r for r in self.recorded["rows"]
                if (r["model"], r["batch"], r["context"]) == (model, b, c)]

    def refresh(self, change=None) -> None:
        c = self.controls
        v = {name: control.value for name, control in c.items()}
        model = MODELS[v["model"]]
        rows = self._recorded_rows(v["model"], v["batch"], v["context"])
        notes = []
        recorded_rates = v["rates"] == "recorded" and bool(rows)
        if v["rates"] == "recorded" and not rows:
            notes.append(f"{v['model']}: nothing recorded; the rates are what-if")
        with self._quiet():
            c["pcie_gbps"].disabled = c["recompute_tflops"].disabled = recorded_rates
            if recorded_rates:
                c["pcie_gbps"].value = round(rows[0]["h2d_gbps"], 1)
                c["recompute_tflops"].value = round(rows[0]["recompute_tflops"])
            c["l"].max = v["context"]
        provenance = label(self.recorded)
        source = (f"rates {provenance} with {rows[0]['model']} {rows[0]['batch']} x "
                  f"{rows[0]['context']}" if recorded_rates else "what-if rates")
        hw = LinkAndCompute(c["pcie_gbps"].value * 1e9, c["recompute_tflops"].value * 1e12, source)
        shape = LayerShape(model, v["batch"], v["context"])
        same_point = rows and (rows[0]["batch"], rows[0]["context"]) == (v["batch"], v["context"])
        best = best_split(shape, hw, "pipelined", v["chunks"])
        self.status.value = (
            f"Pipelined optimum l={best.l}: {1e3 * model.num_layers * best.seconds:.1f} ms per "
            f"step, {best.speedup:.2f}x full transfer (modelled). "
            + ("" if same_point or not rows else
               f"Measured points are shown only at a recorded shape; nearest recorded: "
               f"batch {rows[0]['batch']} x {rows[0]['context']}. ")
            + "".join(f"<br>{html.escape(n)}" for n in notes)
        )
        show_figure(self.figures["split"], split_figure(
            shape, hw, c["l"].value, v["chunks"], FIGURE_HEIGHTS["split"],
            measured=rows if same_point else None, provenance=provenance))
        show_figure(self.figures["settings"], (
            settings_figure(rows, provenance, FIGURE_HEIGHTS["settings"]) if rows else
            go.Figure(layout=dict(height=FIGURE_HEIGHTS["settings"],
                                  title=f"{v['model']}: no recorded KVPR steps"))
        ))

    @contextlib.contextmanager
    def _quiet(self):
        """Set controls without re-entering refresh."""
        for control in self.controls.values():
            control.unobserve(self.refresh, names="value")
        try:
            yield
        finally:
            for control in self.controls.values():
                control.observe(self.refresh, names="value")
