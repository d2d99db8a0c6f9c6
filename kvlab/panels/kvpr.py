"""The "KVPR" tab: the predicted decode-step time against the split point l under the paper's,
the chunked and the pipelined model of time, each optimum marked, the chosen l drawn, and the
steps measured at the nearest recorded point (`python -m kvlab bench kvpr`) on top; below, the
timeline of one recorded decode step (Gantt, per stream) and the step time of every setting with
the fastest KVPR split's speedup over full transfer, full recompute and HF's offloaded cache.

The curves model the chosen schedule: a step is num_layers x GPU batches units, each with its
GPU batch's share of the batch and, with offloaded weights, of the layer's weight bytes (a column
shares one load among its GPU batches; `kvlab.offload.scheduler.unit_shape`). Without a GPU the
column schedule is the recorded one, in 4 GPU batches. The models need `v_com` (PCIe GB/s) and
`v_gpu` (recompute TFLOP/s). With rates "recorded" the sliders take the rates measured with the
nearest recorded point of the model, and the pipelined model also takes the layer's own time and
the host's time per unit and chunk recorded with them; with "what-if" the rates are free, those
times are left out, and the figure's title says so. For a model with no rates recorded the toggle
is "what-if" and disabled.

Wiring only. Without a GPU (backend "sim") the figures show the recorded H200 result. On a GPU a
Measure button runs `kvlab.bench.kvpr.measure_point` at the chosen model, batch, context, schedule
(with its GPU batches), weights placement and chunks, HF's offloaded cache beside it if asked (torch
loads only then), and the figures show that, "measured on <GPU>".
"""

from __future__ import annotations

import contextlib
import html

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.offload.scheduler import SCHEDULES, WEIGHTS, LinkAndCompute, best_split, unit_shape
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.results import KVPR, label, load_shown
from kvlab.viz.layout import note_figure, unreadable_figure
from kvlab.viz.offload import (
    describe_point,
    nearest_timeline,
    point_rows,
    recorded_rates,
    schedule_label,
    speedup_figure,
    split_figure,
    split_points,
    timeline_figure,
    with_defaults,
)

__all__ = ["KVPRTab", "recorded_options"]

FIGURE_HEIGHTS = {"split": 420, "timeline": 360, "speedup": 400}
MAX_CONTEXT = 32768
MEASURE_STEPS = 5  # timed decode steps per setting when measuring here
TOGGLE_STYLE = {"button_width": "84px"}  # two buttons beside the description in a grid cell
COLUMN_GPU_BATCHES = 4  # GPU batches of a column (sharing one weight load): recorded, GPU default
WHAT_IF = {"pcie_gbps": 55.0, "recompute_tflops": 500.0}  # the sliders' values before any record
# What the tab reads of the recording (`kvlab.results.load_result`'s keys)
KVPR_KEYS = {"rows": ("model", "batch", "context", "setting", "step_ms", "tokens_per_s",
                      "h2d_gbps", "recompute_tflops"),
             "timelines": ("model", "batch", "context", "setting", "spans")}


def recorded_options(result: dict, key: str, order: tuple[str, ...]) -> list[str]:
    """The values of `key` ("schedule", "weights") in the rows and timelines of `result`, read
    with `with_defaults`, in `order` (values not in it last)."""
    entries = [*result["rows"], *result.get("timelines", [])]
    found = list(dict.fromkeys(with_defaults(e)[key] for e in entries))
    return [o for o in order if o in found] + [o for o in found if o not in order]


class KVPRTab:
    """controls: model, batch, context, rates ("recorded" / "what-if"), pcie_gbps,
    recompute_tflops, l, chunks; schedule and weights where there is a choice (both recorded, or
    a GPU to measure on); on a GPU also gpu_batches (of the column schedule) and hf (measure HF's
    offloaded cache too). figures: split, timeline, speedup (`FigurePane`s). On the "cuda"
    backend `measure_button` measures the chosen point (`progress` follows it); on "sim" both
    are None. Where the recording cannot be read (`unreadable["kvpr"]`: why), the figures of
    steps say which file and why, and the curves take what-if rates. Raises ValueError naming
    a parameter whose value its control does not offer."""

    key = "kvpr"
    title = "KVPR"

    def __init__(self, model: str = "opt-6.7b", batch: int = 16, context: int = 1024):
        self.backend = backend()
        self.unreadable: dict[str, str] = {}
        self.recorded = load_shown(*KVPR, KVPR_KEYS, self.unreadable, "kvpr")
        # `_key` of the controls -> measure_point's {"rows": [...], "timeline": {...} or None}
        self.measured: dict[tuple, dict] = {}
        self._rates_forced = False  # "what-if" set by the tab, for a model without rates
        gpu = self.backend == "cuda"
        recorded = self.recorded if not gpu and self.recorded is not None else {"rows": []}
        schedules = recorded_options(recorded, "schedule", SCHEDULES) or list(SCHEDULES)
        weights = recorded_options(recorded, "weights", WEIGHTS) or list(WEIGHTS)
        self.defaults = {"schedule": schedules[0], "weights": weights[0]}
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", name="model", options=list(MODELS),
                             value=model),
            "batch": labeled(widgets.BoundedIntText, "batch", name="batch", min=1, max=1024,
                             value=batch),
            "context": labeled(widgets.BoundedIntText, "context s' (tokens)", name="context",
                               min=1, max=MAX_CONTEXT, value=context),
            "rates": labeled(widgets.ToggleButtons, "rates", options=["recorded", "what-if"],
                             value="recorded", style=TOGGLE_STYLE),
            "pcie_gbps": labeled(widgets.FloatSlider, "PCIe H2D (GB/s)", min=1.0, max=128.0,
                                 step=0.1, value=WHAT_IF["pcie_gbps"],
                                 continuous_update=False),
            "recompute_tflops": labeled(widgets.FloatSlider, "recompute (TFLOP/s)", min=1.0,
                                        max=2000.0, step=1.0,
                                        value=WHAT_IF["recompute_tflops"],
                                        continuous_update=False),
            "l": labeled(widgets.IntSlider, "split l (tokens)", min=0, max=context, value=0,
                         continuous_update=False),
            "chunks": labeled(widgets.IntSlider, "X chunks per layer", min=1, max=16, value=1,
                              continuous_update=False),
        }
        for name, options in (("schedule", schedules), ("weights", weights)):
            if len(options) > 1:
                self.controls[name] = labeled(widgets.ToggleButtons, name, options=options,
                                              value=options[0], style=TOGGLE_STYLE)
        if gpu:
            self.controls["gpu_batches"] = labeled(
                widgets.BoundedIntText, "GPU batches (column)", min=1, max=1024,
                value=COLUMN_GPU_BATCHES)
            self.controls["hf"] = labeled(widgets.Checkbox, "HF offloaded cache too",
                                          value=False)
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.measure_button = self.progress = None
        if gpu:
            self.measure_button = widgets.Button(description="Measure", button_style="primary")
            self.progress = widgets.IntProgress(min=0, max=1, value=0, description="measuring")
            self.measure_button.on_click(self.measure)
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        self.widget = self._layout()
        self.refresh()

    def _layout(self) -> widgets.Widget:
        c = self.controls
        choices = [c[name] for name in ("schedule", "gpu_batches", "weights") if name in c]
        measure = ([c["hf"], self.measure_button, self.progress]
                   if self.measure_button is not None else [])
        grid = [c["model"], c["rates"], c["batch"], c["pcie_gbps"], c["context"],
                c["recompute_tflops"], c["chunks"], c["l"], *choices]
        return widgets.VBox([control_grid(grid), widgets.HBox(measure), self.status,
                             *self.figures.values()])

    def _values(self) -> dict:
        v = {**self.defaults, **{name: c.value for name, c in self.controls.items()}}
        if v["schedule"] == "row":
            v["gpu_batches"] = 1  # row-by-row runs the batch as one
        elif "gpu_batches" not in v:
            v["gpu_batches"] = COLUMN_GPU_BATCHES  # what was recorded
        return v

    @staticmethod
    def _key(v: dict) -> tuple:
        """What a measurement depends on: the point, schedule, GPU batches, weights, chunks."""
        return (v["model"], v["batch"], v["context"], v["schedule"], v["gpu_batches"],
                v["weights"], v["chunks"])

    def measure(self, button=None) -> None:
        """Measure the chosen point on this GPU (`kvlab.bench.kvpr.measure_point`), then show it."""
        from kvlab.bench.kvpr import measure_point  # imports torch: the GPU path only

        v = self._values()
        self.progress.value = 0

        def progress(num_done, num_total):
            self.progress.max, self.progress.value = num_total, num_done

        self.measure_button.disabled = True
        try:
            self.measured[self._key(v)] = measure_point(
                v["model"], v["batch"], v["context"], schedule=v["schedule"],
                gpu_batches=v["gpu_batches"], weights=v["weights"], steps=MEASURE_STEPS,
                chunks=v["chunks"], hf=v["hf"], progress=progress)
        except Exception as error:  # a click handler's traceback reaches only the log: show it
            self.status.value += (f"<br><span style='color:#d62728'>measuring failed: "
                                  f"{html.escape(repr(error))}</span>")
            return
        finally:
            self.measure_button.disabled = False
        self.refresh()

    def refresh(self, change=None) -> None:
        """Show what was measured here at the controls' point if anything, else the recorded
        point nearest to it."""
        c = self.controls
        v = self._values()
        model = MODELS[v["model"]]
        measured = self.measured.get(self._key(v))
        if measured is not None:
            rows, timeline, provenance = measured["rows"], measured.get("timeline"), device_label()
        elif self.recorded is None:  # not recorded, or unreadable
            rows, timeline, provenance = [], None, "recorded"  # its figures: "not recorded"
        else:
            rows = point_rows(self.recorded, v["model"], v["batch"], v["context"])
            timeline = nearest_timeline(self.recorded.get("timelines", []), v["model"],
                                        v["batch"], v["context"], v["schedule"], v["weights"],
                                        gpu_batches=v["gpu_batches"])
            provenance = label(self.recorded)
        points = split_points(rows, v["schedule"], v["weights"], v["gpu_batches"])
        rate_row = next((r for r in [*points, *rows] if r.get("h2d_gbps") is not None), None)
        unreadable = self.unreadable.get("kvpr") if measured is None else None
        notes = [f"unreadable recording: {unreadable}"] if unreadable else []
        with self._quiet():
            self._offer_rates(rate_row is not None)
            use_recorded = c["rates"].value == "recorded"
            c["pcie_gbps"].disabled = c["recompute_tflops"].disabled = use_recorded
            if use_recorded:
                c["pcie_gbps"].value = round(rate_row["h2d_gbps"], 1)
                c["recompute_tflops"].value = round(rate_row["recompute_tflops"])
            c["l"].max = v["context"]
            if "gpu_batches" in c:
                c["gpu_batches"].disabled = v["schedule"] == "row"
        if rate_row is None:
            notes.append(f"{v['model']}: no rates recorded at any point; the rates are what-if "
                         f"(PCIe {c['pcie_gbps'].value:.1f} GB/s, recompute "
                         f"{c['recompute_tflops'].value:.0f} TFLOP/s: set them)")
        if v["context"] > model.max_position:
            notes.append(f"context {v['context']} is past the maximum of {v['model']} "
                         f"({model.max_position} tokens): modelled anyway")
        if use_recorded:  # with the layer's own time and the host's, as recorded
            rates = recorded_rates(rate_row, f"rates {provenance}, at {rate_row['batch']} x "
                                             f"{rate_row['context']}")
        else:
            rates = LinkAndCompute(c["pcie_gbps"].value * 1e9,
                                   c["recompute_tflops"].value * 1e12, "what-if rates")
        gpu_batches = v["gpu_batches"]
        if v["batch"] % gpu_batches:
            notes.append(f"batch {v['batch']} does not split into {gpu_batches} GPU batches: "
                         "modelled as one")
            gpu_batches = 1
        shape = unit_shape(model, v["batch"], v["context"], v["schedule"], gpu_batches,
                           v["weights"])
        same_point = rows and (rows[0]["batch"], rows[0]["context"]) == (v["batch"], v["context"])
        if self.backend == "cuda" and measured is None:
            notes.append("press Measure to measure this point on this GPU")
        self.status.value = self._status(v, shape, gpu_batches, rates, rows, timeline, provenance,
                                         notes)
        show_figure(self.figures["split"], split_figure(
            shape, rates, c["l"].value, v["chunks"], FIGURE_HEIGHTS["split"],
            measured=points if same_point else None, provenance=provenance,
            gpu_batches=gpu_batches, note=next((n for n in notes if "maximum" in n), "")))
        command = (f"python -m kvlab bench kvpr --models {v['model']} --batches {v['batch']} "
                   f"--contexts {v['context']}")
        where = ("press Measure to measure it here" if self.backend == "cuda" else
                 "run on a GPU")
        if unreadable:
            gantt = unreadable_figure("One decode step", unreadable, FIGURE_HEIGHTS["timeline"])
        elif timeline and timeline.get("spans"):
            gantt = timeline_figure(timeline["spans"], provenance, FIGURE_HEIGHTS["timeline"],
                                    point=describe_point(timeline))
        else:
            gantt = note_figure(
                "One decode step", provenance if rows else f"not {provenance}",
                f"{v['model']}, {v['schedule']} schedule: no decode-step timeline "
                f"{'measured' if measured else 'recorded'};<br>{where}:<br>{command} "
                f"--schedules {v['schedule']}", FIGURE_HEIGHTS["timeline"])
        show_figure(self.figures["timeline"], gantt)
        show_figure(self.figures["speedup"], (
            speedup_figure(rows, provenance, FIGURE_HEIGHTS["speedup"]) if rows else
            unreadable_figure(f"{v['model']}: KVPR vs the baselines", unreadable,
                              FIGURE_HEIGHTS["speedup"]) if unreadable else
            note_figure(f"{v['model']}: KVPR vs the baselines", f"not {provenance}",
                        f"{v['model']}: no recorded KVPR steps;<br>{where}:<br>{command}",
                        FIGURE_HEIGHTS["speedup"])))

    def _offer_rates(self, recorded: bool) -> None:
        """Offer "recorded" rates only where some were recorded: elsewhere the toggle shows
        "what-if", disabled, with the what-if defaults (not the rates of the model shown
        before), and returns to "recorded" once a model with rates is chosen again."""
        c = self.controls
        if recorded:
            if self._rates_forced:
                c["rates"].value, self._rates_forced = "recorded", False
        elif c["rates"].value == "recorded":
            c["rates"].value, self._rates_forced = "what-if", True
            c["pcie_gbps"].value = WHAT_IF["pcie_gbps"]
            c["recompute_tflops"].value = WHAT_IF["recompute_tflops"]
        c["rates"].disabled = not recorded

    @staticmethod
    def _status(v, shape, gpu_batches, rates, rows, timeline, provenance, notes) -> str:
        best = best_split(shape, rates, "pipelined", v["chunks"])
        units = shape.model.num_layers * gpu_batches
        lines = [f"Pipelined optimum l={best.l}: {1e3 * units * best.seconds:.1f} ms per step "
                 f"({schedule_label({**v, 'gpu_batches': gpu_batches})}), {best.speedup:.2f}x "
                 "full transfer (modelled)."]
        if rates.unit_host_seconds or rates.layer_seconds:
            lines.append(f"Per layer, as recorded: its own work "
                         f"{1e3 * rates.layer_seconds:.2f} ms; "
                         f"the host {1e3 * rates.unit_host_seconds:.2f} ms to enqueue it, "
                         f"{1e3 * rates.chunk_host_seconds:.2f} ms more per recompute chunk.")
        if rows:
            b, c = rows[0]["batch"], rows[0]["context"]
            lines.append(f"Steps shown: {v['model']} batch {b} x {c} ({provenance}; requested "
                         f"batch {v['batch']} x {v['context']})."
                         + ("" if (b, c) == (v["batch"], v["context"]) else
                            f" Measured points are shown only at a recorded shape; nearest "
                            f"recorded: batch {b} x {c}."))
        lines.append(f"Timeline: {describe_point(timeline)}." if timeline else
                     f"Timeline: none of {v['model']} with the {v['schedule']} schedule.")
        return "<br>".join(html.escape(line) for line in lines + notes)

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
