"""The "L2 and counters" tab: why L2 prefetch pays or not.

Three charts for the chosen model, kernel family and shape:
- the paper's counters (its Table 5.2, on an H20) beside the H200's: measured now, on "Profile with
  ncu" (a CUDA GPU with Nsight Compute: `kvlab.profile` runs ncu on this launch without prefetch
  and with the chosen one, some 10-60 s), else where `python -m kvlab bench counters` recorded
  them (the nearest recorded point, and the status line says how it differs);
- the regime map: the best prefetch setting's speedup by SM count and shape, where `python -m
  kvlab bench attention --sms ...` recorded it (`kvlab.viz.regime`);
- the L2 model's answer for this shape, block size and SM count, without prefetch and with the
  chosen prefetch (mode, distance) (`kvlab.sim`, on the CPU: modelled, and labelled so), on
  "Model the L2" (about a second a setting).
A changed control clears what was computed on request, so that charts and controls never
disagree. Wiring only; a chart with nothing recorded says what to run.
"""

from __future__ import annotations

import dataclasses
import html
import shutil

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.kernels import FAMILIES
from kvlab.kernels.geometry import FAMILY_BLOCK_SIZES, GQA_BLOCK_SIZES, GQA_MAX_GROUP
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.results import label, load_shown
from kvlab.viz.counters import modelled_l2_figure, table_5_2_figure
from kvlab.viz.layout import note_figure, unreadable_figure
from kvlab.viz.regime import regime_figure

__all__ = ["L2Tab"]

FIGURE_HEIGHTS = {"counters": 420, "regime": 420, "modelled": 360}
H200_SMS = 132
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
MAX_MODELLED_SECTORS = 48 * 2**20  # about a second of the model per setting on one core
PAPER = "the paper's figures: arXiv 2504.06319, Table 5.2, NVIDIA H20"


class L2Tab:
    """Controls: model, kernel, batch, context, block_size, sms, prefetch (bulk or line),
    distance. Figures: counters, regime, modelled (`FigurePane`s). `profile_button` is there on
    the "cuda" backend with ncu on PATH, else None (`status` says why). A recording that cannot
    be read (`unreadable`: name -> why) is named, with why, where it would be shown.
    Raises ValueError naming a parameter whose value its control does not offer."""

    key, title = "l2", "L2 and counters"

    def __init__(self, model: str = "llama2-7b", kernel: str = "vllm_v1", batch: int = 8,
                 context: int = 4096, num_sms: int = H200_SMS, distance: int = 1,
                 block_size: int = 16, prefetch: str = "bulk"):
        self.unreadable: dict[str, str] = {}
        self.counters = self._recorded_counters()
        self.regime = load_shown("h200", (REGIME,), REGIME_KEYS, self.unreadable, REGIME)
        self.backend = backend()
        self.profiled: list[dict] | None = None  # Table 5.2 entries of "Profile with ncu"
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", name="model", options=list(MODELS),
                             value=model),
            "kernel": labeled(widgets.Dropdown, "kernel family", name="kernel", options=FAMILIES,
                              value=kernel),
            "batch": labeled(widgets.BoundedIntText, "batch", name="batch", min=1, max=1024,
                             value=batch),
            "context": labeled(widgets.BoundedIntText, "context (tokens)", name="context", min=1,
                               max=131072, value=context),
            "block_size": labeled(widgets.Dropdown, "block_size (tokens)", name="block_size",
                                  options=GQA_BLOCK_SIZES, value=block_size),
            "sms": labeled(widgets.IntSlider, "SMs", name="num_sms", min=8, max=H200_SMS,
                           value=num_sms, continuous_update=False),
            "prefetch": labeled(widgets.Dropdown, "L2 prefetch", name="prefetch",
                                options=("bulk", "line"), value=prefetch),
            "distance": labeled(widgets.Dropdown, "prefetch distance", name="distance",
                                options=(1, 2, 4, 8), value=distance),
        }
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.model_button = widgets.Button(description="Model the L2", icon="calculator",
                                           tooltip="replay this launch through kvlab.sim")
        self.model_button.on_click(self.model)
        self.profile_button = None
        if self.backend == "cuda" and shutil.which("ncu"):
            self.profile_button = widgets.Button(
                description="Profile with ncu", icon="microchip",
                tooltip="Nsight Compute on this launch, without and with the prefetch")
            self.profile_button.on_click(self.profile)
        for control in self.controls.values():
            control.observe(self.refresh, names="value")
        buttons = [b for b in (self.model_button, self.profile_button) if b is not None]
        self.widget = widgets.VBox([control_grid(list(self.controls.values())),
                                    widgets.HBox(buttons), self.status, *self.figures.values()])
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
        if v["block_size"] not in FAMILY_BLOCK_SIZES[v["kernel"]]:
            return (f"{v['kernel']} runs block sizes {FAMILY_BLOCK_SIZES[v['kernel']]}, not "
                    f"{v['block_size']}")
        m = MODELS[v["model"]]
        if v["kernel"] == "gqa" and m.num_qo_heads // m.num_kv_heads > GQA_MAX_GROUP:
            return (f"gqa serves groups up to {GQA_MAX_GROUP}; {v['model']} has "
                    f"{m.num_qo_heads // m.num_kv_heads}")
        return None

    def refresh(self, change=None) -> None:
        v = self._values()
        if change is not None:
            self.profiled = None
        show_figure(self.figures["counters"], self._counters(v))
        show_figure(self.figures["regime"], self._regime(v))
        show_figure(self.figures["modelled"], note_figure(
            "L2, modelled", "modelled by kvlab.sim on the CPU, on request",
            "press Model the L2 for this shape",
            FIGURE_HEIGHTS["modelled"]))

    def model(self, button=None) -> None:
        """Model the chosen launch's L2 (`kvlab.sim`) and show it."""
        show_figure(self.figures["modelled"], self._modelled(self._values()))

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
        show_figure(self.figures["counters"], self._counters(v))

    def _counters(self, v: dict):
        if self.profiled is not None:
            self.status.value = html.escape(f"counters: measured now with ncu, {device_label()}")
            return table_5_2_figure(v["model"], self.profiled,
                                    f"{PAPER}<br>H200: {device_label()}, ncu",
                                    FIGURE_HEIGHTS["counters"])
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
        self.status.value = "<br>".join(html.escape(line) for line in [
            self._recorded_note(v, entries),
            *(f"unreadable recording: {why}" for why in self.unreadable.values())])
        provenance = PAPER if self.counters is None else f"{PAPER}<br>H200 {label(self.counters)}"
        return table_5_2_figure(v["model"], entries, provenance, FIGURE_HEIGHTS["counters"])

    def _recorded_note(self, v: dict, entries: list[dict]) -> str:
        """The status line under recorded counters: what differs from the controls, and how to
        measure this launch."""
        how = ("press Profile with ncu to measure this launch" if self.profile_button is not None
               else "measuring needs a CUDA GPU and Nsight Compute (ncu)")
        if not entries:
            return f"counters: none recorded for {v['model']}, {v['kernel']}; {how}"
        e = entries[0]
        asked = (v["batch"], v["context"], v["block_size"], v["sms"], self._prefetch(v).label())
        shown = (e["batch"], e["context"], e["block_size"], e["num_sms_used"], e["prefetch"])
        if asked == shown:
            return f"counters: recorded at this launch; {how}"
        return (f"counters: recorded at batch {e['batch']} x {e['context']}, block "
                f"{e['block_size']}, {e['num_sms_used']} SMs, {e['prefetch']}, the nearest to "
                f"batch {v['batch']} x {v['context']}, block {v['block_size']}, {v['sms']} SMs, "
                f"{self._prefetch(v).label()}; {how}")

    def _regime(self, v: dict):
        title = f"Where L2 prefetch pays: {v['kernel']}"
        if REGIME in self.unreadable:
            return unreadable_figure(title, self.unreadable[REGIME], FIGURE_HEIGHTS["regime"])
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
        provenance = (f"modelled by kvlab.sim on the CPU: the H200's L2, fill latency "
                      f"{FILL_LATENCY_ROUNDS:g} and<br>CTA phase jitter {JITTER_ROUNDS:g} rounds "
                      "assumed (against ncu: benchmarks/README.md)")
        shape = (f"{v['model']} ({m.num_qo_heads}:{m.num_kv_heads}), {v['kernel']}, "
                 f"batch {v['batch']} x {v['context']}, block {v['block_size']}, "
                 f"{v['sms']} SMs")
        group = m.num_qo_heads // m.num_kv_heads
        reads = 2 * v["batch"] * v["context"] * m.num_kv_heads * m.head_dim * 2
        sectors = reads * (group if v["kernel"] == "vllm_v1" else 1) // 32
        why = self._unsupported(v)
        if why is not None:
            return note_figure("L2, modelled", provenance, html.escape(why),
                               FIGURE_HEIGHTS["modelled"])
        if sectors > MAX_MODELLED_SECTORS:
            return note_figure("L2, modelled", provenance,
                               f"{shape}:<br>{sectors / 2**20:.0f} M sector loads, too many to "
                               "model live here;<br>call kvlab.sim.simulate on it",
                               FIGURE_HEIGHTS["modelled"])
        settings = [PrefetchConfig(), self._prefetch(v)]
        results = {p.label(): simulate(launch_spec(v["model"], v["kernel"], v["batch"],
                                                   v["context"], v["sms"], p,
                                                   block_size=v["block_size"]))
                   for p in settings}
        times, roofline = self._modelled_times(v, results)
        return modelled_l2_figure(results, shape, provenance, FIGURE_HEIGHTS["modelled"],
                                  times, roofline)

    def _modelled_times(self, v: dict, results: dict) -> tuple[dict | None, float | None]:
        """The time model's ms per setting and the copy roofline it used (interpolated between
        the SM counts measured with the regime map), or (None, None) without those records."""
        from kvlab.sim.time_model import TimeModel, copy_roofline_gbps

        try:
            model = TimeModel.recorded()
        except ValueError:
            return None, None
        if self.regime is None:
            return None, None
        measured = {self.regime["num_sms"]: self.regime["roofline_copy_gbps"], **{
            int(k): g for k, g in self.regime["roofline_copy_gbps_by_sms"].items()}}
        roofline = copy_roofline_gbps(v["sms"], measured)
        return {name: model.predict_result_ms(v["kernel"], r, v["sms"], roofline)
                for name, r in results.items()}, roofline
