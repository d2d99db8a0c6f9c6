"""The "L2 and counters" tab: why L2 prefetch pays or not.

Three charts for the chosen model, GPU, kernel family and shape, redrawn on every change:
- the paper's counters (its Table 5.2, on an H20) beside the H200's: measured now, on "Profile with
  ncu" (a CUDA GPU with Nsight Compute: `kvlab.profile` runs ncu on this launch without prefetch
  and with the chosen one, some 10-60 s), else where `python -m kvlab bench counters` recorded
  them (the nearest recorded point, and the status line says how it differs);
- the regime map: the best prefetch setting's speedup by SM count and shape, where `python -m
  kvlab bench attention --sms ...` recorded it (`kvlab.viz.regime`);
- the L2 model's answer for this shape, block size and SM count, without prefetch and with the
  chosen prefetch (mode, distance) (`kvlab.sim`, on the CPU: modelled, and labelled so), on the
  chosen GPU's L2 and SMs, timed with its rates (`kvlab.gpus`). A launch of more than
  MAX_MODELLED_SECTORS a setting is replayed as a miniature (`kvlab.sim.sample`: some of its
  sequences or KV heads on a share of the SMs and of the L2), and the chart says which.
The GPU control: the H200 (kvlab.gpus.REFERENCE) is the GPU of the recordings; for another, the
L2 model is "modelled for <GPU>" and its rates assumed, and the counters and the regime map say
they are the H200's. A setting no kernel takes on the GPU (a block size of the other family, a
bulk prefetch before sm_90, K and V past its memory: `kvlab.predict.point.launch_point`) is named
in the status line and every chart. Wiring only; a chart with nothing recorded says what to run.
"""

from __future__ import annotations

import dataclasses
import html
import shutil
import textwrap

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.gpus import GPUS, REFERENCE, copy_roofline_gbps, l2_gbps_per_sm
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES
from kvlab.kernels.families import BLOCK_SIZES
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.panels.widgets import (
    control_grid,
    figure_widget,
    gpu_control,
    labeled,
    modelled_for,
    show_figure,
)
from kvlab.predict.closed_form import sm_roofline_gbps
from kvlab.predict.point import launch_point
from kvlab.results import label, load_shown
from kvlab.sim.l2 import FILL_LATENCY_ROUNDS
from kvlab.sim.sample import replay, sample_launch
from kvlab.sim.spec import JITTER_ROUNDS
from kvlab.sim.time_model import TimeModel
from kvlab.viz.counters import modelled_l2_figure, table_5_2_figure
from kvlab.viz.layout import note_figure, note_text, unreadable_figure
from kvlab.viz.regime import regime_figure

__all__ = ["L2Tab"]

FIGURE_HEIGHTS = {"counters": 420, "regime": 420, "modelled": 420}
SUBTITLE_CHARS = 70  # of a subtitle line (kvlab.viz.layout: about 70 fit a 500 px chart)
MIN_SMS = 8  # the SMs slider's least
PROFILE_TIMEOUT_S = 600  # both launches, compiling included
# the recorded `bench counters` runs the tab shows (counters_sms holds counters's points and more
# SM counts); the first one's metadata labels them
COUNTERS = ("counters_sms", "counters_prefetch", "counters_block32")
REGIME = "attention_sms"  # the recorded SM scaling the regime map draws
# What the tab reads of the recordings (`kvlab.results.load_result`'s keys)
COUNTERS_KEYS = {"table": ("model", "kernel", "batch", "context", "block_size", "num_sms_used",
                           "prefetch", "column", "ours_baseline", "ours_prefetch")}
REGIME_KEYS = {"num_sms": int, "roofline_copy_gbps": float, "roofline_copy_gbps_by_sms": dict,
               "rows": ("model", "kernel", "batch", "context", "block_size", "prefetch", "ms",
                        "num_qo_heads", "num_kv_heads")}
# the most sectors of loads the L2 model replays a setting (kvlab.sim.sample): two settings, the
# prefetches' lookups too, in under a second on one core
MAX_MODELLED_SECTORS = 12 * 2**20
PAPER = "the paper's figures: arXiv 2504.06319, Table 5.2, NVIDIA H20"
TITLES = {"counters": "Table 5.2's counters", "regime": "Where L2 prefetch pays",
          "modelled": "L2, modelled"}


class L2Tab:
    """Controls: model, gpu (kvlab.gpus' keys; default: the GPU in use where the table holds
    it, else the H200), kernel, batch, context, block_size, sms (up to the GPU's SMs; default:
    all of them), prefetch (bulk or line), distance. Figures: counters, regime, modelled
    (`FigurePane`s). `profile_button` is there on the "cuda" backend with ncu on PATH, else None
    (`status` says why). A recording that cannot be read (`unreadable`: name -> why) is named,
    with why, where it would be shown.
    Raises ValueError naming a parameter whose value its control does not offer."""

    key, title = "l2", "L2 and counters"

    def __init__(self, model: str = "llama2-7b", kernel: str = "vllm_v1", batch: int = 8,
                 context: int = 4096, num_sms: int | None = None, distance: int = 1,
                 block_size: int = 16, prefetch: str = "bulk", gpu: str | None = None):
        self.unreadable: dict[str, str] = {}
        self.counters = self._recorded_counters()
        self.regime = load_shown("h200", (REGIME,), REGIME_KEYS, self.unreadable, REGIME)
        self.backend = backend()
        self.profiled: list[dict] | None = None  # Table 5.2 entries of "Profile with ncu"
        self._holding = False  # True while the GPU control sets the SMs: one refresh for both
        gpu_dropdown = gpu_control(gpu)
        total = GPUS[gpu_dropdown.value].num_sms
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", name="model", options=list(MODELS),
                             value=model),
            "gpu": gpu_dropdown,
            "kernel": labeled(widgets.Dropdown, "kernel family", name="kernel", options=FAMILIES,
                              value=kernel),
            "batch": labeled(widgets.BoundedIntText, "batch", name="batch", min=1, max=1024,
                             value=batch),
            "context": labeled(widgets.BoundedIntText, "context (tokens)", name="context", min=1,
                               max=131072, value=context),
            "block_size": labeled(widgets.Dropdown, "block_size (tokens)", name="block_size",
                                  options=BLOCK_SIZES, value=block_size),
            "sms": labeled(widgets.IntSlider, "SMs", name="num_sms", min=MIN_SMS, max=total,
                           value=total if num_sms is None else num_sms,
                           continuous_update=False),
            "prefetch": labeled(widgets.Dropdown, "L2 prefetch", name="prefetch",
                                options=("bulk", "line"), value=prefetch),
            "distance": labeled(widgets.Dropdown, "prefetch distance", name="distance",
                                options=(1, 2, 4, 8), value=distance),
        }
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.profile_button = None
        if self.backend == "cuda" and shutil.which("ncu"):
            self.profile_button = widgets.Button(
                description="Profile with ncu", icon="microchip",
                tooltip="Nsight Compute on this launch, without and with the prefetch")
            self.profile_button.on_click(self.profile)
        for name, control in self.controls.items():
            control.observe(self._on_gpu if name == "gpu" else self.refresh, names="value")
        buttons = [] if self.profile_button is None else [widgets.HBox([self.profile_button])]
        self.widget = widgets.VBox([control_grid(list(self.controls.values())), *buttons,
                                    self.status, *self.figures.values()])
        self.refresh()

    def _recorded_counters(self) -> dict | None:
        """The recorded `bench counters` runs (COUNTERS) as one: the first's metadata and the
        Table 5.2 entries of all, other prefetch settings and block sizes included. None where
        none is recorded (or readable)."""
        runs = [r for r in (load_shown("h200", (n,), COUNTERS_KEYS, self.unreadable, n)
                            for n in COUNTERS) if r is not None]
        if not runs:
            return None
        return {**runs[0], "table": [e for r in runs for e in r["table"]]}

    def _values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def _prefetch(self, v: dict) -> PrefetchConfig:
        return PrefetchConfig(v["prefetch"], distance=v["distance"])

    def _unsupported(self, v: dict) -> str | None:
        """Why the kernel cannot run the chosen launch (None: it can)."""
        family = KERNEL_FAMILIES[v["kernel"]]
        if v["block_size"] not in family.block_sizes:
            return (f"{family.name} runs block sizes {family.block_sizes}, not "
                    f"{v['block_size']}")
        m = MODELS[v["model"]]
        if family.max_group is not None and m.num_qo_heads // m.num_kv_heads > family.max_group:
            return (f"{family.name} serves groups up to {family.max_group}; {v['model']} has "
                    f"{m.num_qo_heads // m.num_kv_heads}")
        return None

    def _refusal(self, v: dict) -> str | None:
        """Why no kernel takes the controls' launch on the chosen GPU
        (`kvlab.predict.point.launch_point`'s ValueError, naming the parameter), or None."""
        try:
            launch_point(v["model"], v["batch"], v["context"], block_size=v["block_size"],
                         family=v["kernel"], prefetch=self._prefetch(v), num_sms=v["sms"],
                         gpu_key=v["gpu"])
        except ValueError as error:
            return str(error)
        return None

    def _on_gpu(self, change) -> None:
        """The SMs slider follows the GPU: at most its SMs (a value past them is clamped), and
        all of one GPU's SMs stay all of the next's. One refresh."""
        sms = self.controls["sms"]
        whole = sms.value == GPUS[change["old"]].num_sms
        self._holding = True
        try:
            sms.max = GPUS[change["new"]].num_sms
            if whole:
                sms.value = sms.max
        finally:
            self._holding = False
        self.refresh(change)

    def refresh(self, change=None) -> None:
        """Show the controls' launch; a changed control drops what "Profile with ncu"
        measured."""
        if self._holding:
            return
        if change is not None:
            self.profiled = None
        self._show(self._values())

    def _show(self, v: dict) -> None:
        why = self._refusal(v)
        if why is not None:
            self._show_refused(v, why)
            return
        counters, counters_note = self._counters(v)
        show_figure(self.figures["counters"], counters)
        show_figure(self.figures["regime"], self._regime(v))
        # last: the recorded charts reach the page without waiting for the L2 model's replays
        modelled, modelled_notes = self._modelled(v)
        show_figure(self.figures["modelled"], modelled)
        lines = [counters_note, *modelled_notes,
                 *(f"unreadable recording: {why}" for why in self.unreadable.values())]
        self.status.value = "<br>".join(html.escape(line) for line in lines)

    def _show_refused(self, v: dict, why: str) -> None:
        """The status line and every chart say that no kernel takes the setting, and why."""
        heading = f"no kernel takes this setting on the {GPUS[v['gpu']].name}"
        self.status.value = html.escape(f"{heading}: {why}")
        note = note_text(why)
        for name, pane in self.figures.items():
            show_figure(pane, note_figure(self._title(name, v), "not measured, not modelled",
                                          f"{html.escape(heading)}:<br>{note}",
                                          FIGURE_HEIGHTS[name]))

    def _title(self, name: str, v: dict) -> str:
        """The title of chart `name` for the controls `v`."""
        if name == "modelled":
            return TITLES[name] if v["gpu"] == REFERENCE else f"L2, {modelled_for(v['gpu'])}"
        return f"{TITLES[name]}: {v['model'] if name == 'counters' else v['kernel']}"

    def _not_this_gpu(self, v: dict) -> list[str]:
        """For a GPU other than the H200, the subtitle line of a chart of the H200's
        recordings."""
        if v["gpu"] == REFERENCE:
            return []
        return [f"the {GPUS[REFERENCE].name}'s recordings, not {modelled_for(v['gpu'])}"]

    def profile(self, button=None) -> None:
        """Profile the chosen launch with ncu on this GPU, without and with the chosen prefetch
        (`kvlab.profile.measure_many`, one ncu run), and show its Table 5.2 (the status line
        says why where ncu gives no whole row)."""
        from kvlab.bench.counters import table
        from kvlab.profile import CountersError, KernelSpec, measure_many

        v = self._values()
        why = self._unsupported(v)
        if why is not None:
            self.status.value = html.escape(f"cannot profile this launch: {why}")
            return
        import torch

        total = torch.cuda.get_device_properties(0).multi_processor_count
        base = KernelSpec.for_model(v["model"], v["kernel"], "none", batch=v["batch"],
                                    context=v["context"], block_size=v["block_size"],
                                    num_sms=None if v["sms"] >= total else v["sms"])
        specs = [base, dataclasses.replace(base, prefetch=self._prefetch(v).label())]
        self.status.value = "profiling with ncu (both launches; compiling included)..."
        try:
            rows = measure_many(specs, timeout_s=PROFILE_TIMEOUT_S)
        except CountersError as err:
            self.status.value = html.escape(f"ncu gave no counters: {err}")
            return
        self.profiled = table([{"model": v["model"], **row} for row in rows])
        self._show(v)

    def _counters(self, v: dict):
        """(The counters chart, its status line)."""
        if self.profiled is not None:
            return table_5_2_figure(v["model"], self.profiled,
                                    f"{PAPER}<br>H200: {device_label()}, ncu",
                                    FIGURE_HEIGHTS["counters"]), (
                f"counters: measured now with ncu, {device_label()}")
        entries = [] if self.counters is None else [
            e for e in self.counters["table"]
            if e["kernel"] == v["kernel"] and e["model"] == v["model"]]
        if entries:  # the recorded point nearest the controls
            nearest = min(entries, key=lambda e: (abs(e["num_sms_used"] - v["sms"]),
                                                  abs(e["batch"] - v["batch"]),
                                                  abs(e["context"] - v["context"]),
                                                  e["block_size"] != v["block_size"],
                                                  e["prefetch"] != self._prefetch(v).label()))
            entries = [e for e in entries if all(e[k] == nearest[k] for k in (
                "batch", "context", "num_sms_used", "block_size", "prefetch"))]
        provenance = "<br>".join([PAPER] + ([] if self.counters is None else [
            f"H200 {label(self.counters)}"]) + self._not_this_gpu(v))
        return (table_5_2_figure(v["model"], entries, provenance, FIGURE_HEIGHTS["counters"]),
                self._recorded_note(v, entries))

    def _recorded_note(self, v: dict, entries: list[dict]) -> str:
        """The status line under recorded counters: what differs from the controls, and how to
        measure this launch."""
        how = ("press Profile with ncu to measure this launch" if self.profile_button is not None
               else "measuring needs a CUDA GPU and Nsight Compute (ncu)")
        whose = "counters" if v["gpu"] == REFERENCE else (
            f"counters (the {GPUS[REFERENCE].name}'s, not {modelled_for(v['gpu'])})")
        if not entries:
            return f"{whose}: none recorded for {v['model']}, {v['kernel']}; {how}"
        e = entries[0]
        asked = (v["batch"], v["context"], v["block_size"], v["sms"], self._prefetch(v).label())
        shown = (e["batch"], e["context"], e["block_size"], e["num_sms_used"], e["prefetch"])
        if asked == shown:
            return f"{whose}: recorded at this launch; {how}"
        return (f"{whose}: recorded at batch {e['batch']} x {e['context']}, block "
                f"{e['block_size']}, {e['num_sms_used']} SMs, {e['prefetch']}, the nearest to "
                f"batch {v['batch']} x {v['context']}, block {v['block_size']}, {v['sms']} SMs, "
                f"{self._prefetch(v).label()}; {how}")

    def _regime(self, v: dict):
        title = self._title("regime", v)
        if REGIME in self.unreadable:
            return unreadable_figure(title, self.unreadable[REGIME], FIGURE_HEIGHTS["regime"])
        if self.regime is None:
            return note_figure(title, "not recorded on the H200 yet",
                               "SM scaling not recorded yet; run on a GPU:"
                               "<br>python -m kvlab bench attention --sms 132 78 32",
                               FIGURE_HEIGHTS["regime"])
        provenance = "<br>".join([label(self.regime), *self._not_this_gpu(v)])
        try:
            return regime_figure(self.regime["rows"], v["kernel"], provenance,
                                 height=FIGURE_HEIGHTS["regime"])
        except ValueError as err:
            return note_figure(title, provenance, html.escape(str(err)),
                               FIGURE_HEIGHTS["regime"])

    def _modelled(self, v: dict):
        """(The L2 model's chart, its status lines): the launch, or its miniature, replayed on
        the chosen GPU's L2 without prefetch and with the chosen one."""
        g, m = GPUS[v["gpu"]], MODELS[v["model"]]
        assumed = (f"fill latency {FILL_LATENCY_ROUNDS:g} and CTA phase jitter "
                   f"{JITTER_ROUNDS:g} rounds assumed")
        provenance = (f"modelled by kvlab.sim on the CPU: the H200's L2, {assumed} (against "
                      "ncu: benchmarks/README.md)" if g.key == REFERENCE else
                      f"{modelled_for(g.key)} by kvlab.sim on the CPU: its "
                      f"{g.l2_bytes / 2**20:g} MiB L2; its rates (kvlab.gpus), {assumed}")
        shape = (f"{v['model']} ({m.num_qo_heads}:{m.num_kv_heads}), {v['kernel']}, "
                 f"batch {v['batch']} x {v['context']}, block {v['block_size']}, "
                 f"{v['sms']} SMs")
        samples = {p.label(): sample_launch(v["model"], v["kernel"], v["batch"], v["context"],
                                            v["sms"], p, MAX_MODELLED_SECTORS, g.l2_bytes,
                                            block_size=v["block_size"])
                   for p in (PrefetchConfig(), self._prefetch(v))}
        sample = samples["none"]
        results = {name: replay(s) for name, s in samples.items()}
        times, roofline, notes = self._modelled_times(v, results)
        replayed = (f"replayed on {sample.describe()} with their share of the L2 "
                    "(kvlab.sim.sample)")
        notes.insert(0, f"L2 model: the whole launch replayed on the {g.name}'s L2"
                     if sample.whole else f"L2 model: {replayed}; more than "
                     f"{MAX_MODELLED_SECTORS / 2**20:g} M sector loads a setting")
        return modelled_l2_figure(
            results, shape, "<br>".join(textwrap.wrap(provenance, SUBTITLE_CHARS)),
            FIGURE_HEIGHTS["modelled"], times, roofline, title=self._title("modelled", v),
            details=() if sample.whole else tuple(textwrap.wrap(replayed, SUBTITLE_CHARS)),
        ), notes

    def _modelled_times(self, v: dict, results: dict) -> tuple[dict | None, float | None,
                                                                   list[str]]:
        """(The time model's ms per setting on the chosen GPU, the copy roofline it used,
        status lines). The H200's roofline is interpolated between the SM counts measured with
        the regime map; another GPU's L2 rate per SM and roofline are assumptions (kvlab.gpus,
        kvlab.predict), which the lines give. Without those records: (None, None, why)."""
        if self.regime is None:
            return None, None, []
        g = GPUS[v["gpu"]]
        measured = {self.regime["num_sms"]: self.regime["roofline_copy_gbps"], **{
            int(k): gbps for k, gbps in self.regime["roofline_copy_gbps_by_sms"].items()}}
        try:
            model = TimeModel.recorded()
            notes = []
            if g.key != REFERENCE:
                model = dataclasses.replace(model, l2_gbps_per_sm=l2_gbps_per_sm(g)[0])
                notes = [f"{g.name}: copy roofline {copy_roofline_gbps(g)[1]}",
                         f"{g.name}: L2 rate {l2_gbps_per_sm(g)[1]}"]
            roofline = sm_roofline_gbps(g, v["sms"], measured)
        except ValueError as error:
            return None, None, [f"no modelled time: {error}"]
        return {name: model.predict_result_ms(v["kernel"], r, v["sms"], roofline)
                for name, r in results.items()}, roofline, notes
