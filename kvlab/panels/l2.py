"""The "L2 and counters" tab: why L2 prefetch pays or not.

Three charts for the chosen model, kernel family and shape:
- the paper's counters (its Table 5.2, on an H20) beside the H200's, where `python -m kvlab bench
  counters` recorded them (`kvlab.profile`);
- the regime map: the best prefetch setting's speedup by SM count and shape, where `python -m
  kvlab bench attention --sms ...` recorded it (`kvlab.viz.regime`);
- the L2 model's answer for this shape on this many SMs, without prefetch and with the bulk
  prefetch at the chosen distance (`kvlab.sim`, on the CPU: modelled, and labelled so), on
  "Model the L2" (about a second a setting; a changed control clears it, so that the chart and
  the controls never disagree).
Wiring only; a chart with nothing recorded says what to run.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.kernels import FAMILIES
from kvlab.kernels.geometry import GQA_MAX_GROUP
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.results import label, load_result
from kvlab.viz.counters import modelled_l2_figure, table_5_2_figure
from kvlab.viz.layout import note_figure
from kvlab.viz.regime import regime_figure

__all__ = ["L2Tab"]

FIGURE_HEIGHTS = {"counters": 420, "regime": 420, "modelled": 360}
H200_SMS = 132
MAX_MODELLED_SECTORS = 48 * 2**20  # about a second of the model per setting on one core
PAPER = "the paper's figures: arXiv 2504.06319, Table 5.2, NVIDIA H20"


def _recorded(name: str) -> dict | None:
    try:
        return load_result("h200", name)
    except ValueError:  # not recorded yet
        return None


class L2Tab:
    """Controls: model, kernel, batch, context, sms, distance. Figures: counters, regime,
    modelled (`FigurePane`s)."""

    key, title = "l2", "L2 and counters"

    def __init__(self, model: str = "llama2-7b", kernel: str = "vllm_v1", batch: int = 8,
                 context: int = 4096, num_sms: int = H200_SMS, distance: int = 1):
        # counters_sms covers counters' points and more SM counts; counters alone where absent
        self.counters = _recorded("counters_sms") or _recorded("counters")
        self.regime = _recorded("attention_sms")
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", options=list(MODELS), value=model),
            "kernel": labeled(widgets.Dropdown, "kernel family", options=FAMILIES, value=kernel),
            "batch": labeled(widgets.BoundedIntText, "batch", min=1, max=1024, value=batch),
            "context": labeled(widgets.BoundedIntText, "context (tokens)", min=1,
                               max=131072, value=context),
            "sms": labeled(widgets.IntSlider, "SMs", min=8, max=H200_SMS,
                           value=num_sms, continuous_update=False),
            "distance": labeled(widgets.Dropdown, "prefetch distance", options=(1, 2, 4),
                                value=distance),
        }
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.model_button = widgets.Button(description="Model the L2", icon="calculator",
                                           tooltip="replay this launch through kvlab.sim")
        self.model_button.on_click(self.model)
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        self.widget = widgets.VBox([control_grid(list(self.controls.values())),
                                    self.model_button, *self.figures.values()])
        self.refresh()

    def _values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def refresh(self, change=None) -> None:
        v = self._values()
        show_figure(self.figures["counters"], self._counters(v))
        show_figure(self.figures["regime"], self._regime(v))
        show_figure(self.figures["modelled"], note_figure(
            "L2, modelled", "modelled by kvlab.sim on the CPU, on request",
            "press Model the L2 for this shape",
            FIGURE_HEIGHTS["modelled"]))

    def model(self, button=None) -> None:
        """Model the chosen launch's L2 (`kvlab.sim`) and show it."""
        show_figure(self.figures["modelled"], self._modelled(self._values()))

    def _counters(self, v: dict):
        entries = [] if self.counters is None else [
            e for e in self.counters["table"] if e["kernel"] == v["kernel"]]
        if entries:  # the recorded point nearest the controls
            nearest = min(entries, key=lambda e: (abs(e["num_sms_used"] - v["sms"]),
                                                  abs(e["batch"] - v["batch"]),
                                                  abs(e["context"] - v["context"])))
            entries = [e for e in entries if all(e[k] == nearest[k] for k in (
                "batch", "context", "num_sms_used", "prefetch"))]
        provenance = PAPER if self.counters is None else f"{PAPER}; H200 {label(self.counters)}"
        return table_5_2_figure(v["model"], entries, provenance, FIGURE_HEIGHTS["counters"])

    def _regime(self, v: dict):
        title = f"Where L2 prefetch pays: {v['kernel']}"
        if self.regime is None:
            return note_figure(title, "not recorded on the H200 yet",
                               "SM scaling not recorded yet; run on a GPU:"
                               "<br>python -m kvlab bench attention --sms 132 78 32",
                               FIGURE_HEIGHTS["regime"])
        try:
            return regime_figure(self.regime["rows"], v["kernel"], label(self.regime),
                                 height=FIGURE_HEIGHTS["regime"])
        except ValueError as err:
            return note_figure(title, label(self.regime), html.escape(str(err)),
                               FIGURE_HEIGHTS["regime"])

    def _modelled(self, v: dict):
        from kvlab.sim import simulate
        from kvlab.sim.l2 import FILL_LATENCY_ROUNDS
        from kvlab.sim.plan import launch_spec
        from kvlab.sim.spec import JITTER_ROUNDS

        m = MODELS[v["model"]]
        provenance = (f"modelled by kvlab.sim on the CPU (H200 L2; fill latency "
                      f"{FILL_LATENCY_ROUNDS:g} and CTA phase jitter {JITTER_ROUNDS:g} rounds, "
                      "assumptions; against ncu: benchmarks/README.md)")
        shape = (f"{v['model']} ({m.num_qo_heads}:{m.num_kv_heads}), {v['kernel']}, "
                 f"batch {v['batch']} x {v['context']}, {v['sms']} SMs")
        group = m.num_qo_heads // m.num_kv_heads
        reads = 2 * v["batch"] * v["context"] * m.num_kv_heads * m.head_dim * 2
        sectors = reads * (group if v["kernel"] == "vllm_v1" else 1) // 32
        if v["kernel"] == "gqa" and group > GQA_MAX_GROUP:
            return note_figure("L2, modelled", provenance, f"gqa serves groups up to "
                               f"{GQA_MAX_GROUP}; {v['model']} has {group}",
                               FIGURE_HEIGHTS["modelled"])
        if sectors > MAX_MODELLED_SECTORS:
            return note_figure("L2, modelled", provenance,
                               f"{shape}:<br>{sectors / 2**20:.0f} M sector loads, too many to "
                               "model live here;<br>call kvlab.sim.simulate on it",
                               FIGURE_HEIGHTS["modelled"])
        settings = {"none": PrefetchConfig(),
                    f"bulk K+V d={v['distance']}": PrefetchConfig("bulk",
                                                                  distance=v["distance"])}
        results = {name: simulate(launch_spec(v["model"], v["kernel"], v["batch"], v["context"],
                                              v["sms"], p)) for name, p in settings.items()}
        return modelled_l2_figure(results, shape, provenance, FIGURE_HEIGHTS["modelled"])
