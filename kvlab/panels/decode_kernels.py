"""The "Decode kernels" tab: GB/s of the vllm_v1 and gqa decode kernels, with and without L2
prefetch, against the copy roofline and a plain read of the same bytes (the bound at that size);
and the speedup prefetch gives across batch and context.

Wiring only. Without a GPU (backend "sim") the figures show the recorded H200 results
(`kvlab.results`) at the recorded point nearest the controls, and the block sizes offered are the
recorded ones; where the point shown differs from the one asked for, the figures say so. A model
with nothing recorded shows what to run to record it. On a GPU a Run button measures the
chosen point with `kvlab.bench.attention` (`measure_point`); torch and CuPy load only then.
The KV cache dtype control shows gqa on an fp8 cache against fp16 (recorded:
`attention_fp8.json`; measured: the same loop with `--fp8`). The batch lengths control shows
batches of mixed (lognormal) lengths, without prefetch: gqa, gqa with its split planned for the
longest sequence, vllm_v1 and the read (recorded: `attention_mixed.json`; measured:
`--lengths`). The KV blocks control shows each family on blocks in order beside blocks scattered
through the pool, and SDPA, without prefetch (recorded: `attention_block_order.json`; measured:
`--in-order`). The read is recorded in `attention_read.json`, a run of its own beside gqa and SDPA
(`kvlab.results.ATTENTION`); a Run times it in the point's loop.
A third figure draws one gqa step CTA by CTA beside a read of the same bytes, at the traced point
nearest the model, batch and context, or batch of mixed lengths (recorded: `timeline.json`,
`timeline_mixed.json`; on a GPU the Trace CTAs button traces the point, `trace_point`).
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.kernels import FAMILIES
from kvlab.kernels.prefetch import MAX_DISTANCE, MODES, PrefetchConfig
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.results import (
    ATTENTION,
    label,
    load_shown,
    nearest_point,
    nearest_rows,
    recorded_models,
)
from kvlab.viz.kernels import (
    bandwidth_figure,
    block_order_figure,
    fp8_speedup_figure,
    mixed_figure,
    prefetch_speedup_figure,
    variant,
)
from kvlab.viz.layout import note_figure, unreadable_figure
from kvlab.viz.timeline import timeline_figure
from kvlab.workload import lognormal_spec

RECORDED = ATTENTION  # (machine, result names) of the recorded results shown without a GPU
RECORDED_FP8 = ("h200", ("attention_fp8",))  # gqa on fp8 against fp16, prefetch none, block 16
RECORDED_MIXED = ("h200", ("attention_mixed",))  # mixed lengths, prefetch none, block 16
# both block orders, prefetch none, block 16
RECORDED_BLOCK_ORDER = ("h200", ("attention_block_order",))
RECORDED_TIMELINE = ("h200", ("timeline",))  # traced steps: gqa and the read, CTA by CTA
RECORDED_TIMELINE_MIXED = ("h200", ("timeline_mixed",))  # the same, batches of mixed lengths
# What the tab reads of each recording (`kvlab.results.load_result`'s keys)
ATTENTION_ROWS = ("model", "batch", "context", "kernel", "prefetch", "block_size", "ms", "gbps",
                  "pct_roofline")
TIMELINE_ROWS = ("model", "batch", "context", "block_size", "ms", "phases", "phases_runs", "trace")
MIXED_ROWS = ("lengths", "max_context")
# the view that shows a recording -> (machine, result names), the keys read
RECORDINGS = {
    "attention": (RECORDED, {"roofline_copy_gbps": float, "rows": ATTENTION_ROWS}),
    "fp8": (RECORDED_FP8, {"roofline_copy_gbps": float, "rows": ATTENTION_ROWS}),
    "mixed": (RECORDED_MIXED, {"roofline_copy_gbps": float,
                               "rows": (*ATTENTION_ROWS, *MIXED_ROWS)}),
    "block_order": (RECORDED_BLOCK_ORDER, {"roofline_copy_gbps": float, "rows": ATTENTION_ROWS}),
    "timeline": (RECORDED_TIMELINE, {"rows": TIMELINE_ROWS}),
    "timeline_mixed": (RECORDED_TIMELINE_MIXED, {"rows": (*TIMELINE_ROWS, *MIXED_ROWS)}),
}
KV_DTYPES = ("float16", "fp8")
BLOCK_ORDERS = ("scattered", "in order")  # of the cache's blocks in its pool
# "equal": one context for the batch; else kvlab.workload.lognormal_spec's specs, as recorded
LENGTHS = ("equal", "lognormal:3200,16384", "lognormal:3200,32768", "lognormal:1536,2048")
MIXED_FLAGS = ("--kernels", "vllm_v1", "gqa", "read", "--prefetch", "none")  # as attention_mixed
BLOCK_SIZES = (8, 16, 32, 64, 128, 256)  # gqa's; vllm_v1 supports 8, 16, 32
FIGURE_HEIGHTS = {"bandwidth": 440, "speedup": 440, "timeline": 620}
TRACE_RUNS, TRACE_STEPS = 10, 3  # a traced point's timed runs and traced steps on a GPU
TIMELINE_TITLE = "A decode step, CTA by CTA: where the time goes"

__all__ = ["DecodeKernelsTab", "measure_point", "trace_point"]


def measure_point(
    model: str, batch: int, context: int, block_size: int, distance: int, on_progress=None,
    fp8: bool = False, lengths: str = "equal", in_order: bool = False,
) -> dict:
    """Measure one point on this GPU with `kvlab.bench.attention.run`, as the CLI would:
    vllm_v1 (where it supports `block_size`) and gqa at prefetch none / bulk / line at `distance`,
    (with `fp8`, gqa on an fp8 cache too; with `in_order`, each family without prefetch on a
    cache whose blocks lie in order too), SDPA and a plain read of the same bytes, all timed in
    turn in one loop. With `lengths` a lognormal spec, a batch of those lengths instead of
    `context`: vllm_v1, gqa, gqa_split_longest and the read, without prefetch (`--lengths`).

    Returns the benchmark's result dict (rows of every kernel; gpu, roofline_copy_gbps, ...).
    `on_progress(num_done, num_total)` is called once the loop is timed. Needs torch with CUDA
    and CuPy.
    """
    from kvlab.bench import attention  # imports torch and CuPy: the GPU path only
    from kvlab.bench.cli import parse

    shape = (["--contexts", str(context), "--kernels", *FAMILIES, "sdpa", "read"]
             if lengths == "equal" else ["--lengths", lengths, *MIXED_FLAGS])
    args = parse(["bench", "attention", "--models", model, "--batches", str(batch), *shape,
                  "--block-sizes", str(block_size), "--distances", str(distance),
                  *(["--fp8"] if fp8 else []), *(["--in-order"] if in_order else [])])
    result = attention.run(args)
    if on_progress is not None:
        on_progress(1, 1)
    return result


def trace_point(model: str, batch: int, shape: int | str) -> dict:
    """Trace one point on this GPU as `python -m kvlab bench timeline` does (TRACE_RUNS timed
    runs, TRACE_STEPS traced steps; the copy roofline measured first): `batch` sequences of
    `shape` tokens, or of a lognormal lengths spec. Returns its row
    (`kvlab.bench.timeline.point_row`), the roofline in `roofline_copy_gbps`. Needs torch with
    CUDA and CuPy."""
    from kvlab.bench.timeline import point_row  # imports torch and CuPy: the GPU path only
    from kvlab.timing import Timer, copy_roofline_gbps

    timer = Timer("cuda", num_runs=TRACE_RUNS)
    roofline = copy_roofline_gbps(timer)
    return {**point_row(model, batch, shape, timer, TRACE_STEPS, roofline),
            "roofline_copy_gbps": roofline}


def _trace_key(v: dict) -> tuple:
    """What the timeline traces at the controls `v`: (model, batch, context or lengths spec)."""
    return v["model"], v["batch"], v["context"] if v["lengths"] == "equal" else v["lengths"]


def _gqa_text(model: str) -> str:
    m = MODELS[model]
    return f"{m.num_qo_heads}:{m.num_kv_heads} (group of {m.num_qo_heads // m.num_kv_heads})"


def _nearest(value: int, options: list[int]) -> int:
    return min(options, key=lambda o: (abs(math.log2(o / value)), o))


class DecodeKernelsTab:
    """Decode-attention GB/s per kernel and prefetch setting, and prefetch speedups.

    controls: model, block_size, batch, context (disabled while lengths are mixed), kernel,
        prefetch, distance, gqa_ratio (read-only, the model's num_qo_heads:num_kv_heads),
        kv_dtype, lengths, blocks. figures: bandwidth, speedup, timeline (`FigurePane`s).
    On the "cuda" backend, `run_button` measures the chosen point (`progress` follows it) and
    `trace_button` traces it; on "sim" they are None and the recorded results are shown. A view
    whose recording cannot be read says which file and why (`unreadable`: view -> why); the
    others work. Raises ValueError naming a parameter whose value its control does not offer.
    """

    key = "decode_kernels"
    title = "Decode kernels"

    def __init__(
        self,
        model: str = "llama3-8b",
        block_size: int = 16,
        batch: int = 16,
        context: int = 8192,
        kernel: str = "vllm_v1",
        prefetch: str = "line",
        distance: int = 1,
        kv_dtype: str = "float16",
        lengths: str = "equal",
        blocks: str = "scattered",
    ):
        self.backend = backend()
        self.unreadable: dict[str, str] = {}  # a view of RECORDINGS -> why its recording is not
        (self.recorded, self.recorded_fp8, self.recorded_mixed, self.recorded_order,
         self.recorded_timeline, self.recorded_timeline_mixed) = (
            load_shown(*recorded, keys, self.unreadable, view)
            for view, (recorded, keys) in RECORDINGS.items())
        block_sizes = BLOCK_SIZES if self.backend == "cuda" or self.recorded is None else sorted(
            {r["block_size"] for r in self.recorded["rows"]} - {None}) or BLOCK_SIZES
        # `_key()`: (model, batch, context, block_size, distance, fp8, lengths, in_order) ->
        # result of measure_point
        self.measured: dict[tuple, dict] = {}
        self.traced: dict[tuple, dict] = {}  # `_trace_key` -> trace_point's row
        self.controls = {
            "model": labeled(
                widgets.Dropdown, "model", name="model", options=list(MODELS), value=model
            ),
            "block_size": labeled(
                widgets.Dropdown, "block_size (tokens)", name="block_size", options=block_sizes,
                value=block_size
            ),
            "batch": labeled(widgets.BoundedIntText, "batch", name="batch", min=1, max=1024,
                             value=batch),
            "context": labeled(
                widgets.BoundedIntText, "context (tokens)", name="context", min=1, max=131072,
                value=context
            ),
            "kernel": labeled(widgets.Dropdown, "kernel family", name="kernel", options=FAMILIES,
                              value=kernel),
            "prefetch": labeled(widgets.Dropdown, "L2 prefetch", name="prefetch", options=MODES,
                                value=prefetch),
            "distance": labeled(
                widgets.IntSlider,
                "prefetch distance",
                name="distance",
                min=1,
                max=MAX_DISTANCE,
                value=distance,
                continuous_update=False,
            ),
            "gqa_ratio": labeled(
                widgets.Text, "GQA qo:kv heads", value=_gqa_text(model), disabled=True
            ),
            "kv_dtype": labeled(widgets.Dropdown, "KV cache dtype", name="kv_dtype",
                                options=KV_DTYPES, value=kv_dtype),
            "lengths": labeled(widgets.Dropdown, "batch lengths", name="lengths", options=LENGTHS,
                               value=lengths),
            "blocks": labeled(widgets.Dropdown, "KV blocks", name="blocks", options=BLOCK_ORDERS,
                              value=blocks),
        }
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.run_button = self.progress = self.trace_button = None
        if self.backend == "cuda":
            self.run_button = widgets.Button(description="Run", button_style="primary")
            self.progress = widgets.IntProgress(min=0, max=1, value=0, description="measuring")
            self.run_button.on_click(self.run)
            self.trace_button = widgets.Button(description="Trace CTAs")
            self.trace_button.on_click(self.trace)
        for name, control in self.controls.items():
            if name != "gqa_ratio":
                control.observe(self.refresh, names="value")
        self.widget = self._layout()
        self.refresh()

    def _layout(self) -> widgets.Widget:
        c = self.controls
        run = ([self.run_button, self.progress, self.trace_button]
               if self.run_button is not None else [])
        order = ("model", "kernel", "gqa_ratio", "block_size", "batch", "prefetch", "context",
                 "distance", "kv_dtype", "lengths", "blocks")
        return widgets.VBox([control_grid([c[name] for name in order]), widgets.HBox(run),
                             self.status, *self.figures.values()])

    def _key(self) -> tuple:
        v = {name: control.value for name, control in self.controls.items()}
        # the mixed-lengths and fp8 views read scattered blocks only: Run measures those there
        in_order = v["blocks"] == "in order" and v["lengths"] == "equal" and (
            v["kv_dtype"] != "fp8")
        return (v["model"], v["batch"], v["context"], v["block_size"], v["distance"],
                v["kv_dtype"] == "fp8", v["lengths"], in_order)

    def run(self, button=None) -> None:
        """Measure the chosen point on this GPU (`measure_point`), then show it."""
        self.progress.value = 0

        def on_progress(num_done, num_total):
            self.progress.max, self.progress.value = num_total, num_done

        *point, fp8, lengths, in_order = self._key()
        self.measured[self._key()] = measure_point(*point, on_progress=on_progress, fp8=fp8,
                                                   lengths=lengths, in_order=in_order)
        self.refresh()

    def trace(self, button=None) -> None:
        """Trace the chosen model and batch (of the context, or of the mixed lengths) on this
        GPU (`trace_point`), then show it."""
        v = {name: control.value for name, control in self.controls.items()}
        key = _trace_key(v)
        self.traced[key] = trace_point(*key)
        self.refresh()

    def refresh(self, change=None) -> None:
        """Show the measured result for the controls if there is one, else the recorded one."""
        v = {name: control.value for name, control in self.controls.items()}
        self.controls["gqa_ratio"].value = _gqa_text(v["model"])
        self.controls["context"].disabled = v["lengths"] != "equal"  # the lengths set it
        self._refresh_timeline(v)
        if v["lengths"] != "equal":
            self._refresh_mixed(v)
            return
        if v["kv_dtype"] == "fp8":
            self._refresh_fp8(v)
            return
        if v["blocks"] == "in order":
            self._refresh_block_order(v)
            return
        selected = variant(
            {
                "kernel": v["kernel"],
                "prefetch": PrefetchConfig(v["prefetch"], distance=v["distance"]).label(),
            }
        )
        measured = self.measured.get(self._key())
        if measured is None and (self.recorded is None
                                 or v["model"] not in recorded_models(self.recorded)):
            self._show_not_recorded(v)
            return
        if measured is not None:
            rows, result, provenance = measured["rows"], measured, device_label()
            block_size, notes = v["block_size"], []
        else:
            result, provenance = self.recorded, label(self.recorded)
            rows = nearest_rows(result, v["model"], v["batch"], v["context"])
            recorded_sizes = sorted({r["block_size"] for r in rows} - {None})
            block_size = _nearest(v["block_size"], recorded_sizes)
            notes = []
            if block_size != v["block_size"]:
                notes.append(
                    f"block_size={v['block_size']} not recorded here (recorded: {recorded_sizes})"
                )
            if selected not in {variant(r) for r in rows}:
                notes.append(f"{selected} not recorded")
            if notes:
                notes.append("settings not recorded are not available without a GPU")
            if self.backend == "cuda":
                notes.append("press Run to measure this point on this GPU")
        rows = [r for r in rows if r["block_size"] in (block_size, None)]
        point = rows[0]
        shown = (point["batch"], point["context"], block_size)
        differs = ("" if shown == (v["batch"], v["context"], v["block_size"]) else
                   f"asked for batch={v['batch']} context={v['context']} "
                   f"block_size={v['block_size']}: nearest recorded shown")
        self.status.value = (
            f"Showing {html.escape(point['model'])} batch={point['batch']} "
            f"context={point['context']} block_size={block_size} ({html.escape(provenance)}; "
            f"requested batch={v['batch']} context={v['context']})"
            + "".join(f"<br>{html.escape(n)}" for n in notes)
        )
        show_figure(
            self.figures["bandwidth"],
            bandwidth_figure(rows, result["roofline_copy_gbps"], provenance, selected,
                             FIGURE_HEIGHTS["bandwidth"], note=differs),
        )
        try:
            speedup = prefetch_speedup_figure(
                result["rows"], v["kernel"], v["model"], provenance, block_size,
                FIGURE_HEIGHTS["speedup"],
                note="" if block_size == v["block_size"] else
                f"block_size={v['block_size']} not recorded: {block_size} shown",
            )
        except ValueError as error:
            speedup = note_figure(f"L2 prefetch speedup over none: {v['kernel']}", provenance,
                                  html.escape(str(error)).replace("; ", ";<br>"),
                                  FIGURE_HEIGHTS["speedup"])
        show_figure(self.figures["speedup"], speedup)

    def _point(self, v: dict, recorded: dict | None, **flags):
        """What to show at the controls `v`: (result, measured?, provenance, the rows of its
        point nearest them), the measurement at them if there is one, else `recorded`; None,
        with the command that records it shown (`_show_not_recorded(v, **flags)`), where
        neither holds the model."""
        measured = self.measured.get(self._key())
        result = measured or recorded
        if result is None or v["model"] not in recorded_models(result):
            self._show_not_recorded(v, **flags)
            return None
        provenance = device_label() if measured else label(result)
        return (result, measured is not None, provenance,
                nearest_rows(result, v["model"], v["batch"], v["context"]))

    def _refresh_fp8(self, v: dict) -> None:
        """The fp8 view: gqa on fp8 beside fp16 and SDPA at the point (measured here, else the
        nearest recorded), and fp8's tokens/s over fp16's across the model's points."""
        found = self._point(v, self.recorded_fp8, fp8=True)
        if found is None:
            return
        result, measured, provenance, rows = found
        notes = []
        if v["kernel"] != "gqa":
            notes.append(f"an fp8 cache is read by gqa only, not {v['kernel']}: gqa shown")
        if v["blocks"] == "in order":
            notes.append("fp8: blocks scattered through the pool only")
        if not measured:
            sizes = ", ".join(map(str, sorted({r["block_size"] for r in rows} - {None})))
            settings = ", ".join(sorted({r["prefetch"] for r in rows}))
            notes.append(f"fp8 recorded at block_size {sizes} and prefetch {settings} only")
            if self.backend == "cuda":
                notes.append("press Run to measure this point on this GPU, fp8 included")
        shown = [r for r in rows if r["block_size"] in (v["block_size"], None)] or rows
        sizes = {r["block_size"] for r in shown} - {None}
        shown = [r for r in shown if r["block_size"] in (min(sizes, default=None), None)]
        prefetch = PrefetchConfig(v["prefetch"], distance=v["distance"]).label()
        point = shown[0]
        self.status.value = html.escape(
            f"Showing {point['model']} batch={point['batch']} context={point['context']}, fp8 "
            f"KV cache ({provenance}; requested batch={v['batch']} context={v['context']})"
        ) + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            shown, result["roofline_copy_gbps"], provenance,
            variant({"kernel": "gqa_fp8", "prefetch": prefetch}), FIGURE_HEIGHTS["bandwidth"]))
        try:
            speed = fp8_speedup_figure(result["rows"], v["model"], provenance,
                                       FIGURE_HEIGHTS["speedup"])
        except ValueError as error:
            speed = note_figure("fp8 KV cache: gqa's tokens/s over fp16's", provenance,
                                html.escape(str(error)), FIGURE_HEIGHTS["speedup"])
        show_figure(self.figures["speedup"], speed)

    def _refresh_mixed(self, v: dict) -> None:
        """The mixed-lengths view: the kernels at the batch of `v["lengths"]` nearest the batch
        asked for (measured here, else recorded), and the model's % of the roofline by batch."""
        measured = self.measured.get(self._key())
        result = measured or self.recorded_mixed
        rows = [r for r in (result or {}).get("rows", ())
                if r["model"] == v["model"] and r.get("lengths") == v["lengths"]]
        if not rows:
            self._show_not_recorded(v)
            return
        provenance = device_label() if measured else label(result)
        batches = sorted({r["batch"] for r in rows})
        batch = _nearest(v["batch"], batches)
        shown = {}
        for r in rows:
            if r["batch"] == batch and r["prefetch"] == "none":
                shown.setdefault(variant(r), r)
        shown = list(shown.values())
        point = shown[0]
        mean, longest = lognormal_spec(v["lengths"])
        notes = [f"context: set by the lengths, lognormal of mean {mean} before clipping at "
                 f"{longest}"]
        if batch != v["batch"]:
            notes.append(f"batch={v['batch']} not recorded for these lengths: the nearest shown "
                         f"(recorded: {', '.join(map(str, batches))})")
        if v["kv_dtype"] == "fp8":
            notes.append("mixed lengths: an fp16 cache only")
        notes.append("mixed lengths: without prefetch only")
        if v["blocks"] == "in order":
            notes.append("mixed lengths: blocks scattered through the pool only")
        if not measured and self.backend == "cuda":
            notes.append("press Run to measure these lengths on this GPU")
        self.status.value = html.escape(
            f"Showing {point['model']} batch={batch} of {v['lengths']}: mean length "
            f"{point['context']}, longest {point['max_context']} ({provenance}; requested "
            f"batch={v['batch']})") + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            shown, result["roofline_copy_gbps"], provenance,
            variant({"kernel": v["kernel"], "prefetch": "none"}), FIGURE_HEIGHTS["bandwidth"],
            note=f"{v['lengths']}: context = the mean length; longest {point['max_context']}"))
        show_figure(self.figures["speedup"], mixed_figure(
            result["rows"], v["model"], v["lengths"], provenance, FIGURE_HEIGHTS["speedup"]))

    def _refresh_block_order(self, v: dict) -> None:
        """The block-order view: each family without prefetch on blocks in order beside
        scattered ones, and SDPA, at the point (measured here, else the nearest recorded); and
        the speed ratios across the model's points."""
        found = self._point(v, self.recorded_order, in_order=True)
        if found is None:
            return
        result, measured, provenance, rows = found
        sizes = sorted({r["block_size"] for r in rows} - {None})
        block_size = v["block_size"] if v["block_size"] in sizes else sizes[0]
        shown = [r for r in rows if r["prefetch"] == "none"
                 and r["block_size"] in (block_size, None)
                 and (r["kernel"] in ("sdpa", "read") or r.get("block_order"))]
        notes = []
        if not measured:
            notes.append(f"blocks in order recorded at block_size {', '.join(map(str, sizes))} "
                         "and without prefetch only")
            if self.backend == "cuda":
                notes.append("press Run to measure this point on this GPU, both orders")
        point = shown[0]
        self.status.value = html.escape(
            f"Showing {point['model']} batch={point['batch']} context={point['context']} "
            f"block_size={block_size}, blocks in order beside scattered ({provenance}; requested "
            f"batch={v['batch']} context={v['context']})"
        ) + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            shown, result["roofline_copy_gbps"], provenance,
            variant({"kernel": f"{v['kernel']}_in_order", "prefetch": "none"}),
            FIGURE_HEIGHTS["bandwidth"]))
        show_figure(self.figures["speedup"], block_order_figure(
            result["rows"], v["model"], provenance, FIGURE_HEIGHTS["speedup"]))

    def _refresh_timeline(self, v: dict) -> None:
        """The timeline figure: the step traced here at the controls if there is one, else the
        recorded one nearest them (of the same lengths spec where they are mixed); the command
        that records one where the model has none."""
        mixed = v["lengths"] != "equal"
        row = self.traced.get(_trace_key(v))
        notes = []
        if row is not None:
            provenance = device_label()
        else:
            result = self.recorded_timeline_mixed if mixed else self.recorded_timeline
            why = self.unreadable.get("timeline_mixed" if mixed else "timeline")
            if why is not None:
                show_figure(self.figures["timeline"], unreadable_figure(
                    TIMELINE_TITLE, why, FIGURE_HEIGHTS["timeline"]))
                return
            rows = [r for r in (result or {}).get("rows", ()) if r["model"] == v["model"]
                    and r.get("lengths") == (v["lengths"] if mixed else None)]
            if not rows:
                shape = (f"--lengths {v['lengths']} --batches {v['batch']}" if mixed else
                         f"--points {v['batch']}x{v['context']}")
                command = f"python -m kvlab bench timeline --models {v['model']} {shape}"
                where = ("press Trace CTAs to trace it here" if self.backend == "cuda" else
                         "run on a GPU")
                provenance = "not recorded" if result is None else f"not {label(result)}"
                show_figure(self.figures["timeline"], note_figure(
                    f"A decode step, CTA by CTA: {v['model']}", provenance,
                    f"{v['model']}: not recorded;<br>{where}:<br>{command}",
                    FIGURE_HEIGHTS["timeline"]))
                return
            if mixed:
                batch = _nearest(v["batch"], sorted({r["batch"] for r in rows}))
                row = next(r for r in rows if r["batch"] == batch)
                if batch != v["batch"]:
                    notes.append(f"asked for batch={v['batch']}: nearest traced batch shown")
            else:
                batch, context = nearest_point({"rows": rows}, v["model"], v["batch"],
                                               v["context"])
                row = next(r for r in rows if (r["batch"], r["context"]) == (batch, context))
                if (batch, context) != (v["batch"], v["context"]):
                    notes.append(f"asked for batch={v['batch']} context={v['context']}: "
                                 "nearest traced point shown")
            provenance = label(result)
            if self.backend == "cuda":
                notes.append("press Trace CTAs to trace this point on this GPU")
        if (v["kv_dtype"], v["blocks"]) != ("float16", "scattered") or (
                v["block_size"] != row["block_size"]):
            notes.append("traced at the cache settings above, not this view's")
        try:
            figure = timeline_figure(row, provenance, FIGURE_HEIGHTS["timeline"],
                                     note="; ".join(notes))
        except ValueError as error:  # a row without its trace
            figure = note_figure(TIMELINE_TITLE, provenance, html.escape(str(error)),
                                 FIGURE_HEIGHTS["timeline"])
        show_figure(self.figures["timeline"], figure)

    def _show_not_recorded(self, v: dict, fp8: bool = False, in_order: bool = False) -> None:
        """Figures and status for a model with no recorded rows: titles naming the model and what
        each figure would show, the view's recording, and the command that records it; or, where
        the view's recording cannot be read, which file and why."""
        mixed = v["lengths"] != "equal"
        model = v["model"]
        speed = (f"fp8 KV cache, gqa over fp16: {model}" if fp8 else
                 f"Blocks in order: {model}" if in_order else
                 f"Mixed lengths: {model}" if mixed else
                 f"L2 prefetch speedup: {model}, {v['kernel']}")
        titles = {"bandwidth": f"Decode attention GB/s: {model}", "speedup": speed}
        view = "fp8" if fp8 else "block_order" if in_order else "mixed" if mixed else "attention"
        why = self.unreadable.get(view)
        if why is not None:
            self.status.value = html.escape(f"unreadable recording: {why}")
            for name, title in titles.items():
                show_figure(self.figures[name],
                            unreadable_figure(title, why, FIGURE_HEIGHTS[name]))
            return
        shape = (f"--lengths {v['lengths']} {' '.join(MIXED_FLAGS)}" if mixed else
                 f"--contexts {v['context']}")
        command = (f"python -m kvlab bench attention --models {v['model']} "
                   f"--batches {v['batch']} {shape}" + (" --fp8" if fp8 else "")
                   + (" --in-order" if in_order else ""))
        where = "press Run to measure it here" if self.backend == "cuda" else "run on a GPU"
        note = f"{v['model']}: not recorded;<br>{where}:<br>{command}"
        self.status.value = html.escape(f"{v['model']}: not recorded; {where}: {command}")
        recorded = {"fp8": self.recorded_fp8, "block_order": self.recorded_order,
                    "mixed": self.recorded_mixed, "attention": self.recorded}[view]
        provenance = "not recorded" if recorded is None else f"not {label(recorded)}"
        for name, title in titles.items():
            show_figure(self.figures[name],
                        note_figure(title, provenance, note, FIGURE_HEIGHTS[name]))
