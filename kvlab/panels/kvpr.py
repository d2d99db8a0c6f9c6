"""The "KVPR" tab: the predicted decode-step time against the split point l under the paper's,
the chunked and the pipelined model of time, each optimum marked, the chosen l drawn, and the
steps measured at the nearest recorded point (`python -m kvlab bench kvpr`) on top; below, the
overlap of one recorded decode step (Gantt, per stream) and the step time of every setting with
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

The "gpu" control: the H200 (kvlab.gpus.REFERENCE) shows its recordings. Another GPU shows none
of them: its curves are "modelled for <GPU>", with rates "assumed" in place of "recorded"
(`kvlab.offload.paper.rates_for(gpu, "h200-share")`: each of the H200's measured rates as a share
of its spec, times the GPU's spec; the status line states them) and the layer's and the host's
times left out. Where the runtime's weights and buffers (`kvlab.viz.offload.gpu_bytes`) pass the
GPU's memory, the status line says so, in place of the curves.

Wiring only. Without a GPU (backend "sim") the figures show the recorded H200 result. On a GPU a
Measure button runs `kvlab.bench.kvpr.measure_point` at the chosen model, batch, context, schedule
(with its GPU batches), weights placement and chunks, HF's offloaded cache beside it if asked (torch
loads only then), and the figures show that, "measured on <GPU>", while the gpu control names the
GPU in use (the H200 where kvlab.gpus does not hold it); for another GPU Measure is disabled.
"""

from __future__ import annotations

import contextlib
import html
from dataclasses import replace

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.gpus import GPUS, REFERENCE
from kvlab.offload.paper import rates_for
from kvlab.offload.scheduler import SCHEDULES, WEIGHTS, LinkAndCompute, best_split, unit_shape
from kvlab.panels.widgets import (
    control_grid,
    figure_widget,
    gpu_control,
    gpu_here,
    labeled,
    modelled_for,
    show_figure,
)
from kvlab.results import KVPR, label, load_shown
from kvlab.viz.layout import note_figure, note_text, unreadable_figure
from kvlab.viz.offload import (
    SPLIT_TITLE,
    describe_point,
    gpu_bytes,
    nearest_overlap,
    overlap_figure,
    point_rows,
    recorded_rates,
    schedule_label,
    speedup_figure,
    split_figure,
    split_points,
    with_defaults,
)

__all__ = ["KVPRTab", "recorded_options"]

FIGURE_HEIGHTS = {"split": 420, "overlap": 360, "speedup": 400}
MAX_CONTEXT = 32768
MEASURE_STEPS = 5  # timed decode steps per setting when measuring here
TOGGLE_STYLE = {"button_width": "84px"}  # two buttons beside the description in a grid cell
COLUMN_GPU_BATCHES = 4  # GPU batches of a column (sharing one weight load): recorded, GPU default
WHAT_IF = {"pcie_gbps": 55.0, "recompute_tflops": 500.0}  # the sliders' values before any record
MAX_PCIE_GBPS = 512.0  # the H2D slider's end: past the GH200's NVLink-C2C, 450 GB/s each way
# What the tab reads of the recording (`kvlab.results.load_result`'s keys)
KVPR_KEYS = {"rows": ("model", "batch", "context", "setting", "step_ms", "tokens_per_s",
                      "h2d_gbps", "recompute_tflops"),
             "timelines": ("model", "batch", "context", "setting", "spans")}


def recorded_options(result: dict, key: str, order: tuple[str, ...]) -> list[str]:
    """The values of `key` ("schedule", "weights") in the rows and overlaps ("timelines", the
    recorded key) of `result`, read with `with_defaults`, in `order` (values not in it last)."""
    entries = [*result["rows"], *result.get("timelines", [])]
    found = list(dict.fromkeys(with_defaults(e)[key] for e in entries))
    return [o for o in order if o in found] + [o for o in found if o not in order]


class KVPRTab:
    """controls: model, gpu (a key of kvlab.gpus.GPUS; default `gpu_control`'s), batch, context,
    rates ("recorded", or "assumed" for a GPU other than the H200; "what-if"), pcie_gbps,
    recompute_tflops, l, chunks; schedule and weights where there is a choice (both recorded, or
    a GPU to measure on); on a GPU also gpu_batches (of the column schedule) and hf (measure HF's
    offloaded cache too). figures: split, overlap, speedup (`FigurePane`s). On the "cuda"
    backend `measure_button` measures the chosen point on the GPU in use (`local_gpu`: the gpu
    control's entry it measures under), enabled while the gpu control names it (`progress`
    follows it); on "sim" both are None. Where the recording cannot be read
    (`unreadable["kvpr"]`: why), the figures of steps say which file and why, and the curves take
    what-if rates. Raises ValueError naming a parameter whose value its control does not
    offer."""

    key = "kvpr"
    title = "KVPR"

    def __init__(self, model: str = "opt-6.7b", batch: int = 16, context: int = 1024,
                 gpu: str | None = None):
        self.backend = backend()
        self.local_gpu = gpu_here() if self.backend == "cuda" else None
        self.unreadable: dict[str, str] = {}
        self.recorded = load_shown(*KVPR, KVPR_KEYS, self.unreadable, "kvpr")
        # `_key` of the controls -> measure_point's {"rows": [...], "overlap": {...} or None}
        self.measured: dict[tuple, dict] = {}
        self._rates_forced = False  # "what-if" set by the tab, for a model without rates
        on_gpu = self.backend == "cuda"
        recorded = self.recorded if not on_gpu and self.recorded is not None else {"rows": []}
        schedules = recorded_options(recorded, "schedule", SCHEDULES) or list(SCHEDULES)
        weights = recorded_options(recorded, "weights", WEIGHTS) or list(WEIGHTS)
        self.defaults = {"schedule": schedules[0], "weights": weights[0]}
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", name="model", options=list(MODELS),
                             value=model),
            "gpu": gpu_control(gpu),
            "batch": labeled(widgets.BoundedIntText, "batch", name="batch", min=1, max=1024,
                             value=batch),
            "context": labeled(widgets.BoundedIntText, "context s' (tokens)", name="context",
                               min=1, max=MAX_CONTEXT, value=context),
            "rates": labeled(widgets.ToggleButtons, "rates", options=["recorded", "what-if"],
                             value="recorded", style=TOGGLE_STYLE),
            "pcie_gbps": labeled(widgets.FloatSlider, "PCIe H2D (GB/s)", min=1.0,
                                 max=MAX_PCIE_GBPS, step=0.1, value=WHAT_IF["pcie_gbps"],
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
        if on_gpu:
            self.controls["gpu_batches"] = labeled(
                widgets.BoundedIntText, "GPU batches (column)", min=1, max=1024,
                value=COLUMN_GPU_BATCHES)
            self.controls["hf"] = labeled(widgets.Checkbox, "HF offloaded cache too",
                                          value=False)
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.measure_button = self.progress = None
        if on_gpu:
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
        grid = [c["model"], c["rates"], c["gpu"], c["pcie_gbps"], c["batch"],
                c["recompute_tflops"], c["context"], c["l"], c["chunks"], *choices]
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
        """Show what was measured here at the controls' point if anything; else, for the H200,
        the recorded point nearest to it, and for another GPU its model."""
        c = self.controls
        v = self._values()
        model = MODELS[v["model"]]
        measured = self.measured.get(self._key(v)) if v["gpu"] == self.local_gpu else None
        modelled = measured is None and v["gpu"] != REFERENCE  # another GPU's model alone
        if measured is not None:
            rows, overlap, provenance = measured["rows"], measured.get("overlap"), device_label()
        elif modelled:
            rows, overlap, provenance = [], None, modelled_for(v["gpu"])
        elif self.recorded is None:  # not recorded, or unreadable
            rows, overlap, provenance = [], None, "recorded"  # its figures: "not recorded"
        else:
            rows = point_rows(self.recorded, v["model"], v["batch"], v["context"])
            overlap = nearest_overlap(self.recorded.get("timelines", []), v["model"],
                                        v["batch"], v["context"], v["schedule"], v["weights"],
                                        gpu_batches=v["gpu_batches"])
            provenance = label(self.recorded)
        points = split_points(rows, v["schedule"], v["weights"], v["gpu_batches"])
        rate_row = next((r for r in [*points, *rows] if r.get("h2d_gbps") is not None), None)
        unreadable = self.unreadable.get("kvpr") if measured is None and not modelled else None
        notes = [f"unreadable recording: {unreadable}"] if unreadable else []
        given = self._given_rates(v, rate_row, provenance, modelled, notes)
        with self._quiet():
            self._offer_rates("assumed" if modelled else "recorded", given is not None)
            use_given = c["rates"].value != "what-if"
            c["pcie_gbps"].disabled = c["recompute_tflops"].disabled = use_given
            if use_given:
                c["pcie_gbps"].value = round(given.h2d_bytes_per_s / 1e9, 1)
                c["recompute_tflops"].value = round(given.recompute_flops_per_s / 1e12)
            c["l"].max = v["context"]
            if "gpu_batches" in c:
                c["gpu_batches"].disabled = v["schedule"] == "row"
        if self.measure_button is not None:
            self.measure_button.disabled = v["gpu"] != self.local_gpu
        if given is None and not modelled:
            notes.append(f"{v['model']}: no rates recorded at any point; the rates are what-if "
                         f"(PCIe {c['pcie_gbps'].value:.1f} GB/s, recompute "
                         f"{c['recompute_tflops'].value:.0f} TFLOP/s: set them)")
        if v["context"] > model.max_position:
            notes.append(f"context {v['context']} is past the maximum of {v['model']} "
                         f"({model.max_position} tokens): modelled anyway")
        rates = given if use_given else LinkAndCompute(
            c["pcie_gbps"].value * 1e9, c["recompute_tflops"].value * 1e12,
            f"what-if rates, {provenance}" if modelled else "what-if rates")
        gpu_batches = v["gpu_batches"]
        if v["batch"] % gpu_batches:
            notes.append(f"batch {v['batch']} does not split into {gpu_batches} GPU batches: "
                         "modelled as one")
            gpu_batches = 1
        shape = unit_shape(model, v["batch"], v["context"], v["schedule"], gpu_batches,
                           v["weights"])
        past = self._past_memory(v, shape)
        same_point = rows and (rows[0]["batch"], rows[0]["context"]) == (v["batch"], v["context"])
        if self.backend == "cuda" and measured is None:
            notes.append("press Measure to measure this point on this GPU"
                         if v["gpu"] == self.local_gpu else
                         f"Measure runs on this machine's GPU: select the "
                         f"{GPUS[self.local_gpu].name} to use it")
        self.status.value = self._status(v, shape, gpu_batches, rates, rows, overlap, provenance,
                                         modelled, past, notes)
        height = FIGURE_HEIGHTS["split"]
        show_figure(self.figures["split"], note_figure(
            SPLIT_TITLE.format(model=model.name), provenance,
            note_text(past), height)
            if past else split_figure(
            shape, rates, c["l"].value, v["chunks"], height,
            measured=points if same_point else None, provenance=provenance,
            gpu_batches=gpu_batches, note=next((n for n in notes if "maximum" in n), "")))
        self._show_steps(v, rows, overlap, provenance, measured is not None, modelled,
                         unreadable)

    def _given_rates(self, v: dict, rate_row: dict | None, provenance: str, modelled: bool,
                     notes: list[str]) -> LinkAndCompute | None:
        """The rates the toggle's first option stands for: those recorded (or measured) with
        `rate_row`, with the layer's and the host's times; for another GPU's model, the rates
        kvlab.offload.paper assumes for it (stated in `notes`); None where there are none."""
        if rate_row is not None:
            return recorded_rates(rate_row, f"rates {provenance}, at {rate_row['batch']} x "
                                            f"{rate_row['context']}")
        if not modelled:
            return None
        g = GPUS[v["gpu"]]
        try:
            assumed = rates_for(g.key, "h200-share")
        except ValueError as error:  # the H200's recordings that the shares come from
            notes.append(f"no rates assumed for the {g.name}: {error}; the rates are what-if "
                         "(set them)")
            return None
        notes.append(f"Rates assumed for the {g.name}: PCIe H2D {assumed.h2d_gbps:.1f} GB/s, "
                     f"{assumed.sources[0]}; recompute {assumed.recompute_tflops:.0f} TFLOP/s, "
                     f"{assumed.sources[1]}. The layer's own time and the host's are left out.")
        return replace(assumed.link_and_compute(), source=f"rates assumed, {provenance}")

    @staticmethod
    def _past_memory(v: dict, shape) -> str:
        """Why the runtime's weights and buffers for `shape` (`gpu_bytes`) do not fit the chosen
        GPU's memory, or "" where they do."""
        g = GPUS[v["gpu"]]
        weights, buffers = gpu_bytes(shape, v["weights"])
        if weights + buffers <= g.memory_bytes:
            return ""
        fix = "offload the weights, or choose" if v["weights"] == "resident" else "choose"
        return (f"{v['model']} at batch {v['batch']} x {v['context']} with weights "
                f"{v['weights']} does not fit the {g.name}: KVPR's runtime keeps at least "
                f"{(weights + buffers) / 1e9:,.1f} GB on it ({weights / 1e9:,.1f} GB of weights, "
                f"{buffers / 1e9:,.1f} GB in two buffer slots of one unit's K, V and X), past "
                f"its {g.memory_bytes / 1e9:,.0f} GB: {fix} a smaller batch or context")

    def _show_steps(self, v: dict, rows: list[dict], overlap: dict | None, provenance: str,
                    measured: bool, modelled: bool, unreadable: str | None) -> None:
        """The overlap and speedup figures: the steps of `rows` and `overlap`, or why there
        are none."""
        command = (f"python -m kvlab bench kvpr --models {v['model']} --batches {v['batch']} "
                   f"--contexts {v['context']}")
        where = ("press Measure to measure it here" if self.backend == "cuda" else
                 "run on a GPU")
        titles = {"overlap": "One decode step",
                  "speedup": f"{v['model']}: KVPR vs the baselines"}
        heights = FIGURE_HEIGHTS
        if modelled:
            only = (f"the {GPUS[REFERENCE].name}'s recordings only:<br>select it to see them, or "
                    f"measure on the {GPUS[v['gpu']].name}:<br>{command}")
            gantt = note_figure(titles["overlap"], provenance, f"decode-step overlaps are {only}",
                                heights["overlap"])
            speedup = note_figure(titles["speedup"], provenance, f"KVPR's steps are {only}",
                                  heights["speedup"])
        else:
            if unreadable:
                gantt = unreadable_figure(titles["overlap"], unreadable, heights["overlap"])
            elif overlap and overlap.get("spans"):
                gantt = overlap_figure(overlap["spans"], provenance, heights["overlap"],
                                       point=describe_point(overlap))
            else:
                gantt = note_figure(
                    titles["overlap"], provenance if rows else f"not {provenance}",
                    f"{v['model']}, {v['schedule']} schedule: no decode-step overlap "
                    f"{'measured' if measured else 'recorded'};<br>{where}:<br>{command} "
                    f"--schedules {v['schedule']}", heights["overlap"])
            speedup = (
                speedup_figure(rows, provenance, heights["speedup"]) if rows else
                unreadable_figure(titles["speedup"], unreadable, heights["speedup"])
                if unreadable else
                note_figure(titles["speedup"], f"not {provenance}",
                            f"{v['model']}: no recorded KVPR steps;<br>{where}:<br>{command}",
                            heights["speedup"]))
        show_figure(self.figures["overlap"], gantt)
        show_figure(self.figures["speedup"], speedup)

    def _offer_rates(self, given: str, available: bool) -> None:
        """Offer `given` rates ("recorded", or "assumed" for another GPU's model) beside
        "what-if", keeping the choice between them, where there are some: elsewhere the toggle
        shows "what-if", disabled, with the what-if defaults (not the rates of the setting shown
        before), and returns to `given` once there are rates again."""
        c = self.controls
        toggle = c["rates"]
        if toggle.options[0] != given:
            what_if = toggle.value == "what-if"
            toggle.options = (given, "what-if")
            toggle.value = "what-if" if what_if else given
        if available:
            if self._rates_forced:
                toggle.value, self._rates_forced = given, False
        elif toggle.value == given:
            toggle.value, self._rates_forced = "what-if", True
            c["pcie_gbps"].value = WHAT_IF["pcie_gbps"]
            c["recompute_tflops"].value = WHAT_IF["recompute_tflops"]
        toggle.disabled = not available

    @staticmethod
    def _status(v, shape, gpu_batches, rates, rows, overlap, provenance, modelled, past,
                notes) -> str:
        if past:
            lines = [past + "."]
        else:
            best = best_split(shape, rates, "pipelined", v["chunks"])
            units = shape.model.num_layers * gpu_batches
            lines = [f"Pipelined optimum l={best.l}: {1e3 * units * best.seconds:.1f} ms per "
                     f"step ({schedule_label({**v, 'gpu_batches': gpu_batches})}), "
                     f"{best.speedup:.2f}x full transfer "
                     f"({provenance if modelled else 'modelled'})."]
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
        if modelled:
            lines.append(f"Steps and overlaps: the {GPUS[REFERENCE].name}'s recordings only "
                         "(select it to see them).")
        else:
            lines.append(f"Overlap: {describe_point(overlap)}." if overlap else
                         f"Overlap: none of {v['model']} with the {v['schedule']} schedule.")
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
