"""The "Decode kernels" tab: GB/s of the vllm_v1 and gqa decode kernels, with and without L2
prefetch, against the copy roofline and a plain read of the same bytes (the bound at that size);
and the speedup prefetch gives across batch and context.

Wiring only. Every point answers at once: a point recorded on the H200 shows its recording
(`kvlab.results`); any other point, model, head layout (the model "custom": query heads, KV
heads and head dim set by hand), block size the kernels take, or GPU of `kvlab.gpus` shows
`kvlab.predict`'s closed form, hatched, with its held-out error band, and labelled "modelled"
(for another GPU than the H200, "modelled for <GPU>"). On a GPU a Run button measures the chosen
point with `kvlab.bench.attention` (`measure_point`), with FlashInfer's decode where it is
installed; torch and CuPy load only then. FlashInfer beside the others is recorded on an H100
(`h100/attention_flashinfer.json`): the GPU control's h100-sxm shows that recording at its
points, and the H200's view says so where the H100 holds the point. The KV cache dtype control
shows gqa on an fp8 cache against fp16 (recorded: `attention_fp8.json`; measured: the same loop
with `--fp8`). The batch lengths control shows batches of mixed lengths (lognormal, and
FlashInfer's production mix), without prefetch: gqa, gqa with its split planned for the longest
sequence, vllm_v1 and the read (recorded: `attention_mixed.json`; measured: `--lengths`). The KV
blocks control shows each family on blocks in order beside blocks scattered through the pool,
and SDPA, without prefetch (recorded: `attention_block_order.json`; measured: `--in-order`; not
modelled). The read is recorded in `attention_read.json`, a run of its own beside gqa and SDPA
(`kvlab.results.ATTENTION`); a Run times it in the point's loop. A third figure draws one gqa
step CTA by CTA beside a read of the same bytes, at the traced point nearest the model, batch
and context, or batch of mixed lengths (recorded: `timeline.json`, `timeline_mixed.json`; on a
GPU the Trace CTAs button traces the point, `trace_point`). A setting no kernel takes (a GQA
ratio past 8, a shape past the GPU's memory) is named in the status line and the figures.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from kvlab.checks import HEAD_DIMS
from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.gpus import GPUS, REFERENCE
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES
from kvlab.kernels.families import BLOCK_SIZES
from kvlab.kernels.prefetch import MAX_DISTANCE, MODES, PrefetchConfig
from kvlab.panels.widgets import (
    control_grid,
    figure_widget,
    gpu_control,
    gpu_here,
    labeled,
    modelled_for,
    show_figure,
)
from kvlab.predict import decode_launch
from kvlab.predict.point import launch_point
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
from kvlab.viz.layout import note_figure, note_text, unreadable_figure
from kvlab.viz.timeline import timeline_figure
from kvlab.workload import describe_mixed, mixed_lengths

RECORDED = ATTENTION  # (machine, result names) of the recorded results shown without a GPU
RECORDED_FP8 = ("h200", ("attention_fp8",))  # gqa on fp8 against fp16, prefetch none, block 16
RECORDED_MIXED = ("h200", ("attention_mixed",))  # mixed lengths, prefetch none, block 16
# both block orders, prefetch none, block 16
RECORDED_BLOCK_ORDER = ("h200", ("attention_block_order",))
RECORDED_TIMELINE = ("h200", ("timeline",))  # traced steps: gqa and the read, CTA by CTA
RECORDED_TIMELINE_MIXED = ("h200", ("timeline_mixed",))  # the same, batches of mixed lengths
# FlashInfer beside the others: the grid, prefetch none, block 16, recorded on an H100
RECORDED_FLASHINFER = ("h100", ("attention_flashinfer",))
FLASHINFER_GPU = "h100-sxm"  # the kvlab.gpus key of the GPU that recorded it
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
    "flashinfer": (RECORDED_FLASHINFER, {"roofline_copy_gbps": float, "rows": ATTENTION_ROWS}),
}
KV_DTYPES = ("float16", "fp8")
BLOCK_ORDERS = ("scattered", "in order")  # of the cache's blocks in its pool
# "equal": one context for the batch; else kvlab.workload.mixed_spec's specs: those recorded,
# and FlashInfer's production mix scaled to 32k
LENGTHS = ("equal", "lognormal:3200,16384", "lognormal:3200,32768", "lognormal:1536,2048",
           "production:32768")
MIXED_FLAGS = ("--kernels", "vllm_v1", "gqa", "read", "--prefetch", "none")  # as attention_mixed
CUSTOM = "custom"  # the model control's entry for a head layout set by hand
HEAD_FIELDS = ("qo_heads", "kv_heads", "head_dim")
MAX_HEADS = 256  # the head controls' bound; kvlab.predict refuses layouts no kernel takes
# the grid of the modelled speedup figures: (batch, context), and the mixed-lengths batches
MODELLED_POINTS = tuple((b, c) for b in (1, 16, 64) for c in (1024, 4096, 32768))
MODELLED_MIXED_BATCHES = (16, 64, 256)
FIGURE_HEIGHTS = {"bandwidth": 440, "speedup": 440, "timeline": 620}
TRACE_RUNS, TRACE_STEPS = 10, 3  # a traced point's timed runs and traced steps on a GPU
TIMELINE_TITLE = "A decode step, CTA by CTA: where the time goes"

__all__ = ["DecodeKernelsTab", "measure_point", "trace_point"]


def measure_point(
    model: str, batch: int, context: int, block_size: int, distance: int, on_progress=None,
    fp8: bool = False, lengths: str = "equal", in_order: bool = False,
) -> dict:
    """Measure one point on this GPU with `kvlab.bench.attention.measure_point`, as the CLI would:
    vllm_v1 (where it supports `block_size`) and gqa at prefetch none / bulk / line at `distance`,
    (with `fp8`, gqa on an fp8 cache too; with `in_order`, each family without prefetch on a
    cache whose blocks lie in order too), SDPA and a plain read of the same bytes, and where
    flashinfer is installed FlashInfer's decode on both its paths (on gqa's cache), all timed in
    turn in one loop. With `lengths` a mixed-lengths spec, a batch of those lengths instead of
    `context`: vllm_v1, gqa, gqa_split_longest, FlashInfer and the read, without prefetch
    (`--lengths`).

    Returns the benchmark's result dict (rows of every kernel; gpu, roofline_copy_gbps, ...).
    `on_progress(num_done, num_total)` is called once the loop is timed. Needs torch with CUDA
    and CuPy.
    """
    from kvlab.bench import attention  # imports torch and CuPy: the GPU path only
    from kvlab.kernels import flashinfer_peer

    mixed = lengths != "equal"  # as attention_mixed: MIXED_FLAGS
    peers = [*attention.FLASHINFER_TENSOR_CORES] if flashinfer_peer.available() else []
    result = attention.measure_point(
        model, batch, lengths if mixed else context, block_sizes=[block_size],
        distances=[distance], fp8=fp8, in_order=in_order,
        kernels=["vllm_v1", "gqa", "read", *peers] if mixed else [*FAMILIES, "sdpa", "read",
                                                                    *peers],
        **({"prefetch": ["none"]} if mixed else {}))
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


def _heads(model: str) -> tuple[int, int, int]:
    m = MODELS[model]
    return m.num_qo_heads, m.num_kv_heads, m.head_dim


def _nearest(value: int, options: list[int]) -> int:
    return min(options, key=lambda o: (abs(math.log2(o / value)), o))


def _row(name: str, batch: int, lengths: str, family: str, prefetch: str, dtype: str,
         block_size: int, shape: tuple[int, int, int], gpu: str, context: int | None) -> dict:
    """kvlab.predict's closed form for one launch as a benchmark row (the keys kvlab.viz.kernels
    reads), with "basis" (interpolated or extrapolated), "gbps_band" (lo, hi) and "note"; of
    mixed `lengths` also "lengths", "context" (the mean) and "max_context", as recorded."""
    p = decode_launch(shape, batch, context, block_size=block_size, family=family,
                      prefetch=prefetch, dtype=dtype, lengths=lengths, gpu=gpu, recordings=False)
    lo_ms, hi_ms = p.error_band
    row = {"model": name, "batch": batch, "context": context,
           "kernel": f"{family}_fp8" if dtype == "fp8" else family, "prefetch": prefetch,
           "block_size": block_size, "ms": p.time_ms, "gbps": p.gbps,
           "pct_roofline": 100 * p.roofline_share, "basis": p.source,
           "gbps_band": (p.gbps * p.time_ms / hi_ms, p.gbps * p.time_ms / lo_ms), "note": p.note}
    if lengths != "equal":
        lens = mixed_lengths(batch, lengths)  # as decode_launch draws them
        row.update(lengths=lengths, context=round(float(lens.mean())),
                   max_context=int(lens.max()))
    return row


def _roofline(rows: list[dict]) -> float:
    """The copy roofline kvlab.predict's `rows` are a share of (GB/s)."""
    return 100 * rows[0]["gbps"] / rows[0]["pct_roofline"]


def _check_heads(model, heads) -> tuple:
    """The (num_qo_heads, num_kv_heads, head_dim) the tab starts with: `heads`, or the model's
    (llama3-8b's for CUSTOM); ValueError for a model the control does not offer, or heads that
    differ from a preset's."""
    if not isinstance(model, str) or model not in (*MODELS, CUSTOM):
        raise ValueError(f"model={model!r}: must be one of {[*MODELS, CUSTOM]}")
    if heads is None:
        heads = _heads("llama3-8b" if model == CUSTOM else model)
    if not isinstance(heads, tuple | list) or len(heads) != 3:
        raise ValueError(f"heads={heads!r}: must be (num_qo_heads, num_kv_heads, head_dim)")
    if model != CUSTOM and tuple(heads) != _heads(model):
        raise ValueError(f"heads={heads!r}: {model}'s are {_heads(model)}; pass "
                         f"model={CUSTOM!r} for another layout")
    return heads


def _controls(model, gpu, heads, block_size, batch, context, kernel, prefetch, distance,
              kv_dtype, lengths, blocks) -> dict:
    """The tab's controls, set to these values (`labeled` refuses one a control does not
    offer)."""
    dropdown, number = widgets.Dropdown, widgets.BoundedIntText
    return {
        "model": labeled(dropdown, "model", name="model", options=[*MODELS, CUSTOM],
                         value=model),
        "gpu": gpu_control(gpu),
        "qo_heads": labeled(number, "query heads", name="num_qo_heads", min=1, max=MAX_HEADS,
                            value=heads[0]),
        "kv_heads": labeled(number, "KV heads", name="num_kv_heads", min=1, max=MAX_HEADS,
                            value=heads[1]),
        "head_dim": labeled(dropdown, "head_dim", name="head_dim", options=HEAD_DIMS,
                            value=heads[2]),
        "block_size": labeled(dropdown, "block_size (tokens)", name="block_size",
                              options=BLOCK_SIZES, value=block_size),
        "batch": labeled(number, "batch", name="batch", min=1, max=1024, value=batch),
        "context": labeled(number, "context (tokens)", name="context", min=1, max=131072,
                           value=context),
        "kernel": labeled(dropdown, "kernel family", name="kernel", options=FAMILIES,
                          value=kernel),
        "prefetch": labeled(dropdown, "L2 prefetch", name="prefetch", options=MODES,
                            value=prefetch),
        "distance": labeled(widgets.IntSlider, "prefetch distance", name="distance", min=1,
                            max=MAX_DISTANCE, value=distance, continuous_update=False),
        "kv_dtype": labeled(dropdown, "KV cache dtype", name="kv_dtype", options=KV_DTYPES,
                            value=kv_dtype),
        "lengths": labeled(dropdown, "batch lengths", name="lengths", options=LENGTHS,
                           value=lengths),
        "blocks": labeled(dropdown, "KV blocks", name="blocks", options=BLOCK_ORDERS,
                          value=blocks),
    }


class DecodeKernelsTab:
    """Decode-attention GB/s per kernel and prefetch setting, and prefetch speedups.

    controls: model (a preset, or CUSTOM), gpu (kvlab.gpus' keys), qo_heads, kv_heads, head_dim
        (the model's; setting them makes the model CUSTOM), block_size, batch, context (disabled
        while lengths are mixed), kernel, prefetch, distance, kv_dtype, lengths, blocks.
        figures: bandwidth, speedup, timeline (`FigurePane`s).
    On the "cuda" backend, `run_button` measures the chosen point of a preset model on this GPU
    (`progress` follows it) and `trace_button` traces it; on "sim" they are None. A view whose
    recording cannot be read says which file and why (`unreadable`: view -> why); the others
    work. Raises ValueError naming a parameter whose value its control does not offer, and
    heads that differ from a preset `model`'s.
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
        gpu: str | None = None,
        heads: tuple[int, int, int] | None = None,
    ):
        self.backend = backend()
        self.unreadable: dict[str, str] = {}  # a view of RECORDINGS -> why its recording is not
        (self.recorded, self.recorded_fp8, self.recorded_mixed, self.recorded_order,
         self.recorded_timeline, self.recorded_timeline_mixed, self.recorded_flashinfer) = (
            load_shown(*recorded, keys, self.unreadable, view)
            for view, (recorded, keys) in RECORDINGS.items())
        heads = _check_heads(model, heads)
        # `_key()`: (model, batch, context, block_size, distance, fp8, lengths, in_order) ->
        # result of measure_point
        self.measured: dict[tuple, dict] = {}
        self.traced: dict[tuple, dict] = {}  # `_trace_key` -> trace_point's row
        self._holding = False  # True while the model's heads are being set: one refresh after
        # the GPU control's entry that Run's measurements show under: the GPU in use, or where
        # the table lacks it, the control's default (the measurements say "measured on <it>")
        self.local_gpu = gpu_here() if self.backend == "cuda" else None
        self.controls = _controls(model, gpu, heads, block_size, batch, context, kernel,
                                  prefetch, distance, kv_dtype, lengths, blocks)
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.run_button = self.progress = self.trace_button = None
        if self.backend == "cuda":
            self._add_buttons()
        self.controls["model"].observe(self._on_model, names="value")
        for name, control in self.controls.items():
            if name != "model":
                control.observe(self._on_heads if name in HEAD_FIELDS else self.refresh,
                                names="value")
        self.widget = self._layout()
        self.refresh()

    def _add_buttons(self) -> None:
        """Run (measure the point, `progress` follows it) and Trace CTAs, on a GPU."""
        self.run_button = widgets.Button(description="Run", button_style="primary")
        self.progress = widgets.IntProgress(min=0, max=1, value=0, description="measuring")
        self.run_button.on_click(self.run)
        self.trace_button = widgets.Button(description="Trace CTAs")
        self.trace_button.on_click(self.trace)

    def _layout(self) -> widgets.Widget:
        c = self.controls
        run = ([self.run_button, self.progress, self.trace_button]
               if self.run_button is not None else [])
        order = ("model", "gpu", "kernel", "qo_heads", "kv_heads", "head_dim", "block_size",
                 "batch", "context", "prefetch", "distance", "kv_dtype", "lengths", "blocks")
        return widgets.VBox([control_grid([c[name] for name in order]), widgets.HBox(run),
                             self.status, *self.figures.values()])

    def _on_model(self, change) -> None:
        """A preset sets the head controls to its heads (one refresh for all)."""
        if change["new"] != CUSTOM:
            self._holding = True
            try:
                for name, value in zip(HEAD_FIELDS, _heads(change["new"]), strict=True):
                    self.controls[name].value = value
            finally:
                self._holding = False
        self.refresh()

    def _on_heads(self, change) -> None:
        """Heads set by hand make the model CUSTOM where they differ from the preset's."""
        if self._holding:
            return
        model = self.controls["model"].value
        heads = tuple(self.controls[name].value for name in HEAD_FIELDS)
        if model != CUSTOM and heads != _heads(model):
            self._holding = True
            try:
                self.controls["model"].value = CUSTOM
            finally:
                self._holding = False
        self.refresh()

    def _key(self) -> tuple:
        v = {name: control.value for name, control in self.controls.items()}
        # the mixed-lengths and fp8 views read scattered blocks only: Run measures those there
        in_order = v["blocks"] == "in order" and v["lengths"] == "equal" and (
            v["kv_dtype"] != "fp8")
        return (v["model"], v["batch"], v["context"], v["block_size"], v["distance"],
                v["kv_dtype"] == "fp8", v["lengths"], in_order)

    def run(self, button=None) -> None:
        """Measure the chosen point on this GPU (`measure_point`), then show it; a custom head
        layout is not a preset the benchmark runs: the status line says so."""
        if self.controls["model"].value == CUSTOM:
            self.status.value = html.escape("Run measures preset models: choose one (a custom "
                                            "layout is modelled only)")
            return
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
        if v["model"] == CUSTOM:
            self.status.value = html.escape("Trace CTAs traces preset models: choose one")
            return
        key = _trace_key(v)
        self.traced[key] = trace_point(*key)
        self.refresh()

    def _shape(self, v: dict) -> tuple[int, int, int]:
        return tuple(v[name] for name in HEAD_FIELDS)

    def _name(self, v: dict) -> str:
        """The model's name, or the custom layout's: "custom 32:8, head_dim 128"."""
        qo, kv, dim = self._shape(v)
        return v["model"] if v["model"] != CUSTOM else f"custom {qo}:{kv}, head_dim {dim}"

    def _measured(self, v: dict) -> dict | None:
        """Run's measurement at the controls: a preset on this GPU only."""
        if v["model"] == CUSTOM or v["gpu"] != self.local_gpu:
            return None
        return self.measured.get(self._key())

    def _recorded_here(self, v: dict, recorded: dict | None, gpu: str = REFERENCE) -> bool:
        """Whether `recorded` (made on `gpu`) can show the controls: a preset it holds, on
        that GPU."""
        return (recorded is not None and v["gpu"] == gpu and v["model"] != CUSTOM
                and v["model"] in recorded_models(recorded))

    def _flashinfer_at(self, v: dict) -> bool:
        """Whether the H100's recording holds FlashInfer at exactly the controls' point."""
        if not self._recorded_here({**v, "gpu": FLASHINFER_GPU}, self.recorded_flashinfer,
                                   FLASHINFER_GPU):
            return False
        near = nearest_rows(self.recorded_flashinfer, v["model"], v["batch"], v["context"])
        return (near[0]["batch"], near[0]["context"]) == (v["batch"], v["context"]) and any(
            r["kernel"].startswith("flashinfer") for r in near)

    def _grid_recording(self, v: dict) -> dict | None:
        """The attention grid recorded on the GPU chosen, where one holds the model: the H200's,
        or the H100's with FlashInfer."""
        if self._recorded_here(v, self.recorded):
            return self.recorded
        if self._recorded_here(v, self.recorded_flashinfer, FLASHINFER_GPU):
            return self.recorded_flashinfer
        return None

    def _modelled(self, v: dict) -> str:
        """The provenance of kvlab.predict's answers for the GPU chosen."""
        where = ("modelled" if v["gpu"] == REFERENCE else modelled_for(v["gpu"]))
        return f"{where}: closed form (kvlab.predict) fitted on the {GPUS[REFERENCE].name}"

    def _rows(self, v: dict, points, families=FAMILIES, prefetches=None, dtypes=None,
              lengths: str = "equal") -> tuple[list[dict], list[str]]:
        """The closed form's rows at each (batch, context) of `points` (context None with mixed
        `lengths`), for each family that takes the block size and dtype, prefetch label
        (default: none and the chosen mode at the chosen distance, or none alone for mixed
        lengths) and dtype (default: the chosen one); and notes on what was left out (a family
        that does not take the setting, a point past the GPU's memory)."""
        if prefetches is None:
            chosen = PrefetchConfig(v["prefetch"], distance=v["distance"]).label()
            prefetches = ("none",) if lengths != "equal" else dict.fromkeys(("none", chosen))
        dtypes = dtypes or ("fp8" if v["kv_dtype"] == "fp8" else "float16",)
        rows, notes, past = [], [], []
        usable = []  # the prefetch settings the GPU takes
        for prefetch in prefetches:
            try:
                launch_point(self._shape(v), 1, 1, prefetch=prefetch, gpu_key=v["gpu"])
                usable.append(prefetch)
            except ValueError as error:
                notes.append(f"{error}: not shown")
        for family in families:
            block_sizes = KERNEL_FAMILIES[family].block_sizes
            if v["block_size"] not in block_sizes:
                notes.append(f"{family} takes block sizes "
                             f"{', '.join(map(str, block_sizes))}: not shown")
                continue
            for batch, context in points:
                try:  # past the GPU's memory? (the controls' point is checked first: `_check`)
                    launch_point(self._shape(v), batch, context, block_size=v["block_size"],
                                 lengths=lengths, gpu_key=v["gpu"])
                except ValueError:
                    past.append(f"{batch} x {context}")
                    continue
                rows += [_row(self._name(v), batch, lengths, family, prefetch, dtype,
                              v["block_size"], self._shape(v), v["gpu"], context)
                         for dtype in dtypes if dtype in KERNEL_FAMILIES[family].cache_dtypes
                         for prefetch in usable]
        if past:
            notes.append(f"past the {GPUS[v['gpu']].name}'s memory, left out: "
                         f"{', '.join(dict.fromkeys(past))}")
        return rows, notes

    def _check(self, v: dict) -> str | None:
        """Why kvlab.predict cannot take the controls' point (its ValueError), or None."""
        try:
            launch_point(self._shape(v), v["batch"],
                         v["context"] if v["lengths"] == "equal" else None,
                         block_size=v["block_size"], dtype="fp8" if v["kv_dtype"] == "fp8"
                         else "float16", lengths=v["lengths"], gpu_key=v["gpu"],
                         prefetch=PrefetchConfig(v["prefetch"], distance=v["distance"]))
        except ValueError as error:
            return str(error)
        return None

    def refresh(self, change=None) -> None:
        """Show the controls' point: measured here, recorded, or modelled; or why no kernel
        takes it."""
        if self._holding:
            return
        v = {name: control.value for name, control in self.controls.items()}
        self.controls["context"].disabled = v["lengths"] != "equal"  # the lengths set it
        why = self._check(v)
        if why is not None:
            self._show_refused(v, why)
            return
        view = ("mixed" if v["lengths"] != "equal" else "fp8" if v["kv_dtype"] == "fp8" else
                "block_order" if v["blocks"] == "in order" else "attention")
        if view in self.unreadable and v["gpu"] == REFERENCE and v["model"] != CUSTOM:
            self._show_not_recorded(v)  # names the file and why
        else:
            try:
                {"mixed": self._refresh_mixed, "fp8": self._refresh_fp8,
                 "block_order": self._refresh_block_order, "attention": self._refresh_attention,
                 }[view](v)
            except ValueError as error:  # the model's own files (predict.json, rates) unreadable
                self._show_refused(v, str(error), "the model cannot answer")
                return
        # last: the point's own charts reach the page first
        self._refresh_timeline(v)

    def _show_refused(self, v: dict, why: str,
                      heading: str = "no kernel takes this setting") -> None:
        """The status line and the figures say `heading` and why."""
        self.status.value = html.escape(f"{heading}: {why}")
        note = note_text(why)
        titles = {"bandwidth": "Decode attention GB/s", "speedup": "L2 prefetch speedup",
                  "timeline": TIMELINE_TITLE}
        for name, title in titles.items():
            show_figure(self.figures[name], note_figure(
                f"{title.partition(':')[0]}: {self._name(v)}", "not measured, not modelled",
                f"{heading}:<br>{note}", FIGURE_HEIGHTS[name]))

    def _refresh_attention(self, v: dict) -> None:
        """The main view: every variant at the point, recorded where the H200 recorded exactly
        this point and block size (the chosen variant modelled beside them where it is not
        recorded), measured here after Run, else modelled; and the prefetch speedups across the
        model's points, recorded or modelled alike."""
        chosen = PrefetchConfig(v["prefetch"], distance=v["distance"]).label()
        selected = variant({"kernel": v["kernel"], "prefetch": chosen})
        measured = self._measured(v)
        notes, asked = [], (v["batch"], v["context"], v["block_size"])
        rows = None
        if measured is not None:
            rows, roofline, provenance = measured["rows"], measured["roofline_copy_gbps"], (
                device_label())
        elif (recorded := self._grid_recording(v)) is not None:
            near = nearest_rows(recorded, v["model"], v["batch"], v["context"])
            here = [r for r in near if r["block_size"] in (v["block_size"], None)
                    and not r["kernel"].endswith("_fp8")]  # the fp8 cache: its own view
            if (near[0]["batch"], near[0]["context"]) == asked[:2] and any(
                    r["block_size"] == v["block_size"] for r in here):
                rows, roofline, provenance = here, recorded["roofline_copy_gbps"], label(
                    recorded)
                if selected not in {variant(r) for r in rows}:
                    extra, left_out = self._rows(v, [asked[:2]], families=(v["kernel"],),
                                                 prefetches=(chosen,))
                    rows = rows + extra
                    notes += left_out or [f"{selected} not recorded: modelled (hatched)"]
            else:
                notes.append(f"not recorded here; the nearest recorded point: batch="
                             f"{near[0]['batch']} context={near[0]['context']}")
        if rows is None:
            rows, left_out = self._rows(v, [asked[:2]])
            notes += left_out
            roofline, provenance = _roofline(rows), self._modelled(v)
            notes += self._model_notes(v, rows)
        if measured is None and provenance.startswith("recorded") and (
                v["gpu"] == self.local_gpu):
            notes.append("press Run to measure this point on this GPU")
        if (v["gpu"] != FLASHINFER_GPU and not any(r["kernel"].startswith("flashinfer")
                                                   for r in rows)
                and self._flashinfer_at(v)):
            notes.append(f"FlashInfer is recorded on the {GPUS[FLASHINFER_GPU].name} only: "
                         f"choose gpu {FLASHINFER_GPU} to see it beside the others")
        self.status.value = html.escape(
            f"Showing {self._name(v)} batch={v['batch']} context={v['context']} "
            f"block_size={v['block_size']} ({provenance})"
        ) + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            rows, roofline, provenance, selected, FIGURE_HEIGHTS["bandwidth"]))
        self._show_speedup(v, measured)

    def _model_notes(self, v: dict, rows: list[dict]) -> list[str]:
        """What the closed form's answers rest on (the first row's note), its error band, and
        for a preset model the command that records the point (`_command`)."""
        lo, hi = rows[0]["gbps_band"]
        notes = [rows[0]["note"], f"hatched bars: modelled; whiskers: 90% of held-out launches "
                 f"within {lo:,.0f}-{hi:,.0f} GB/s at {rows[0]['gbps']:,.0f} GB/s"]
        if v["model"] != CUSTOM:
            where = ("press Run to measure it here" if v["gpu"] == self.local_gpu else
                     f"to measure it on the {GPUS[v['gpu']].name}")
            notes.append(f"not recorded; {where}: {self._command(v)}")
        return notes

    def _command(self, v: dict) -> str:
        """The command that records the controls' point of a preset model, in its view."""
        mixed = v["lengths"] != "equal"
        shape = (f"--lengths {v['lengths']} {' '.join(MIXED_FLAGS)}" if mixed else
                 f"--contexts {v['context']}")
        flags = ("" if mixed else " --fp8" if v["kv_dtype"] == "fp8" else
                 " --in-order" if v["blocks"] == "in order" else "")
        return (f"python -m kvlab bench attention --models {v['model']} --batches {v['batch']} "
                f"{shape}{flags}")

    def _show_speedup(self, v: dict, measured: dict | None) -> None:
        """Prefetch speedups of the chosen family: measured here or recorded where they hold the
        model and block size; else modelled over MODELLED_POINTS and the point."""
        source, note = measured, ""
        if source is None and self._recorded_here(v, self.recorded):
            source = self.recorded
        provenance = device_label() if measured is not None else label(source) if source else ""
        if source is not None and any(r["block_size"] == v["block_size"] and r["kernel"] ==
                                      v["kernel"] for r in source["rows"]):
            figure = prefetch_speedup_figure(source["rows"], v["kernel"], v["model"], provenance,
                                             v["block_size"], FIGURE_HEIGHTS["speedup"])
        else:
            points = dict.fromkeys([*MODELLED_POINTS, (v["batch"], v["context"])])
            rows, notes = self._rows(v, points, families=(v["kernel"],), prefetches=[
                PrefetchConfig(mode, distance=v["distance"]).label() for mode in MODES])
            provenance = self._modelled(v)
            note = "; ".join(notes)
            if not rows:
                figure = note_figure(f"L2 prefetch speedup: {self._name(v)}, {v['kernel']}",
                                     provenance, html.escape(note), FIGURE_HEIGHTS["speedup"])
                show_figure(self.figures["speedup"], figure)
                return
            figure = prefetch_speedup_figure(rows, v["kernel"], self._name(v), provenance,
                                             v["block_size"], FIGURE_HEIGHTS["speedup"], note)
        show_figure(self.figures["speedup"], figure)

    def _point(self, v: dict, recorded: dict | None):
        """What to show at the controls `v`: (result, measured?, provenance, the rows of its
        point nearest them), the measurement here if there is one, else `recorded` where it
        holds the model on the H200; None where neither does."""
        measured = self._measured(v)
        if measured is None and not self._recorded_here(v, recorded):
            return None
        result = measured or recorded
        provenance = device_label() if measured else label(result)
        return (result, measured is not None, provenance,
                nearest_rows(result, v["model"], v["batch"], v["context"]))

    def _refresh_fp8(self, v: dict) -> None:
        """The fp8 view: gqa on fp8 beside fp16 (and SDPA where timed) at the point, measured
        here, recorded where the H200 recorded exactly this point, else modelled; and fp8's
        tokens/s over fp16's across the model's points."""
        found = self._point(v, self.recorded_fp8)
        notes = []
        if v["kernel"] != "gqa":
            notes.append(f"an fp8 cache is read by gqa only, not {v['kernel']}: gqa shown")
        if v["blocks"] == "in order":
            notes.append("fp8: blocks scattered through the pool only")
        prefetch = PrefetchConfig(v["prefetch"], distance=v["distance"]).label()
        selected = variant({"kernel": "gqa_fp8", "prefetch": prefetch})
        shown = None
        if found is not None:
            result, measured, provenance, rows = found
            shown = [r for r in rows if r["block_size"] in (v["block_size"], None)]
            if not measured and not (self._exact(v, rows) and any(r["block_size"] for r in shown)):
                notes.append(f"not recorded here; the nearest recorded point: batch="
                             f"{rows[0]['batch']} context={rows[0]['context']}")
                shown = None
            elif not measured and self.backend == "cuda":
                notes.append("press Run to measure this point on this GPU, fp8 included")
        if shown is not None:
            roofline, speed_rows = result["roofline_copy_gbps"], result["rows"]
            if selected not in {variant(r) for r in shown}:
                extra, left_out = self._rows(v, [(v["batch"], v["context"])], families=("gqa",),
                                             prefetches=(prefetch,), dtypes=("fp8",))
                shown = shown + extra
                notes += left_out or [f"{selected} not recorded: modelled (hatched)"]
        else:
            asked = [(v["batch"], v["context"])]
            shown, left_out = self._rows(v, asked, families=("gqa",),
                                         prefetches=dict.fromkeys(("none", prefetch)),
                                         dtypes=("float16", "fp8"))
            notes += left_out + self._model_notes(v, shown)
            speed_rows, _ = self._rows(v, dict.fromkeys([*MODELLED_POINTS, *asked]),
                                       families=("gqa",), prefetches=("none",),
                                       dtypes=("float16", "fp8"))
            roofline, provenance = _roofline(shown), self._modelled(v)
        self.status.value = html.escape(
            f"Showing {self._name(v)} batch={v['batch']} context={v['context']}, fp8 KV cache "
            f"({provenance})") + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            shown, roofline, provenance, selected, FIGURE_HEIGHTS["bandwidth"]))
        try:
            speed = fp8_speedup_figure(speed_rows, self._name(v), provenance,
                                       FIGURE_HEIGHTS["speedup"])
        except ValueError as error:
            speed = note_figure("fp8 KV cache: gqa's tokens/s over fp16's", provenance,
                                html.escape(str(error)), FIGURE_HEIGHTS["speedup"])
        show_figure(self.figures["speedup"], speed)

    def _exact(self, v: dict, rows: list[dict]) -> bool:
        """Whether `rows` (of one point) are at the controls' batch and context."""
        return (rows[0]["batch"], rows[0]["context"]) == (v["batch"], v["context"])

    def _refresh_mixed(self, v: dict) -> None:
        """The mixed-lengths view: the kernels at a batch of `v["lengths"]`, measured here,
        recorded where the H200 recorded this batch of them, else modelled; and the model's %
        of the roofline by batch."""
        measured = self._measured(v)
        result = measured or (self.recorded_mixed if self._recorded_here(
            v, self.recorded_mixed) else None)
        rows = [r for r in (result or {}).get("rows", ())
                if r["model"] == v["model"] and r.get("lengths") == v["lengths"]]
        notes = [f"context: set by the lengths, {describe_mixed(v['lengths'])}"]
        batches = sorted({r["batch"] for r in rows})
        if v["batch"] in batches:
            provenance = device_label() if measured else label(result)
            shown = {}
            for r in rows:
                if r["batch"] == v["batch"] and r["prefetch"] == "none":
                    shown.setdefault(variant(r), r)
            shown, roofline, by_batch = list(shown.values()), result["roofline_copy_gbps"], (
                result["rows"])
            if not measured and self.backend == "cuda":
                notes.append("press Run to measure these lengths on this GPU")
        else:
            if batches:
                notes.append(f"batch={v['batch']} not recorded for these lengths (recorded: "
                             f"{', '.join(map(str, batches))})")
            shown, left_out = self._rows(v, [(v["batch"], None)], lengths=v["lengths"])
            notes += left_out + self._model_notes(v, shown)
            by_batch, _ = self._rows(v, [(b, None) for b in sorted(
                {*MODELLED_MIXED_BATCHES, v["batch"]})], lengths=v["lengths"])
            roofline, provenance = _roofline(shown), self._modelled(v)
        if v["kv_dtype"] == "fp8":
            notes.append("mixed lengths: an fp16 cache only")
        notes.append("mixed lengths: without prefetch only")
        if v["blocks"] == "in order":
            notes.append("mixed lengths: blocks scattered through the pool only")
        point = shown[0]
        self.status.value = html.escape(
            f"Showing {self._name(v)} batch={v['batch']} of {v['lengths']}: mean length "
            f"{point['context']}, longest {point['max_context']} ({provenance})"
        ) + "".join(f"<br>{html.escape(n)}" for n in notes)
        show_figure(self.figures["bandwidth"], bandwidth_figure(
            shown, roofline, provenance,
            variant({"kernel": v["kernel"], "prefetch": "none"}), FIGURE_HEIGHTS["bandwidth"],
            note=f"{v['lengths']}: context = the mean length; longest {point['max_context']}"))
        show_figure(self.figures["speedup"], mixed_figure(
            by_batch, self._name(v), v["lengths"], provenance, FIGURE_HEIGHTS["speedup"]))

    def _refresh_block_order(self, v: dict) -> None:
        """The block-order view: each family without prefetch on blocks in order beside
        scattered ones, and SDPA, at the point (measured here, else the nearest recorded); and
        the speed ratios across the model's points."""
        found = self._point(v, self.recorded_order)
        if found is None:
            self._show_not_recorded(v)
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
        row = self.traced.get(_trace_key(v)) if v["gpu"] == self.local_gpu else None
        notes = []
        if v["model"] == CUSTOM:
            show_figure(self.figures["timeline"], note_figure(
                f"A decode step, CTA by CTA: {self._name(v)}", "not traced, not modelled",
                "a custom head layout has no traced step:<br>steps are traced for the preset "
                "models; a step CTA by CTA is not modelled", FIGURE_HEIGHTS["timeline"]))
            return
        if v["gpu"] != REFERENCE and row is None:
            notes.append(f"the {GPUS[REFERENCE].name}'s trace: a step CTA by CTA is not "
                         f"modelled for the {GPUS[v['gpu']].name}")
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
                    f"{v['model']}: not recorded;<br>{where}:<br>{note_text(command)}",
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
            if self.backend == "cuda" and v["gpu"] == self.local_gpu:
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

    def _show_not_recorded(self, v: dict) -> None:
        """Figures and status for a view the H200's recordings cannot show: where the view's
        recording cannot be read, which file and why; for blocks in order (not modelled) of a
        model not recorded, the command that records it, and of a custom layout or another GPU,
        that it is neither recorded nor modelled."""
        mixed = v["lengths"] != "equal"
        fp8 = v["kv_dtype"] == "fp8" and not mixed
        in_order = v["blocks"] == "in order" and not mixed and not fp8
        model = self._name(v)
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
        if v["model"] == CUSTOM or v["gpu"] != REFERENCE:
            provenance = "not measured, not modelled"
            note = (f"{html.escape(model)} on the {GPUS[v['gpu']].name}: not modelled;<br>"
                    f"blocks in order are recorded for preset models on the "
                    f"{GPUS[REFERENCE].name} only")
        else:
            where = "press Run to measure it here" if self.backend == "cuda" else "run on a GPU"
            note = f"{model}: not recorded;<br>{where}:<br>{note_text(self._command(v))}"
            provenance = ("not recorded" if self.recorded_order is None else
                          f"not {label(self.recorded_order)}")
        self.status.value = note.replace("<br>", " ")
        for name, title in titles.items():
            show_figure(self.figures[name],
                        note_figure(title, provenance, note, FIGURE_HEIGHTS[name]))
