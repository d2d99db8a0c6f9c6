"""The "End-to-end" tab: decode tokens/s of whole models against batch, per attention variant,
beside HF transformers' static cache and the roofline; the time of each decode step; and
tokens/s against the number of GPUs a tensor-parallel run splits the model over; where a step's
HBM idles, modelled kernel by kernel; and one step as traced, kernel by kernel.

Wiring only. The recorded H200 results (`results/h200/e2e.json`, `e2e_qwen7b.json`,
`e2e_qwen14b.json`, and the serving runs of `e2e_serving.json` in the status line) are shown on
any machine, labelled so, and so are the tensor-parallel runs where they are recorded
(`results/h200x<N>/e2e.json`, N GPUs of one machine). On a GPU a Generate button runs
`kvlab.LLM` (seeded random weights of the model, attention "auto", CUDA graphs) on the chosen
batch of 512-token prompts and adds its steps, labelled "measured on <GPU>"; torch loads only
then.

The "gpu" control: the H200 (kvlab.gpus.REFERENCE) shows its recordings. Another GPU shows them
modelled for it (`kvlab.viz.e2e.modelled_rows`), labelled "modelled for <GPU>": each step's
roofline step there (the bytes it reads over the GPU's copy roofline, kvlab.gpus) times the
H200's measured ratio to its own roofline step at that point, an assumption the status line
states; the variants it cannot run and the batches past its memory left out, and said; no
tensor-parallel or serving runs. Generate is enabled, and its run shown, while the gpu control
names the GPU in use (the H200 where kvlab.gpus does not hold it).

The GPUs with step traces (TRACED: the H100, the H200) draw their own recordings of one decode
step traced kernel by kernel (`<gpu>/steptrace.json`, at 4k and 32k tokens `steptrace_4k.json`
and `steptrace_32k.json`, whichever are recorded; `python -m kvlab bench steptrace`): each kernel
where it ran in the lane of its group, the gaps between kernels marked, beside the step's bytes
at the copy roofline. The status line adds that GPU's ncu L2 hits where recorded (the H100's): of
the GEMMs' loads with and without the cross-kernel prefetch (`steptrace_counters.json`, at 4k
tokens `steptrace_4k_counters.json`), and of the attention's with and without the K/V blocks'
prefetch (`steptrace_kv_counters.json`).
Another GPU's view names the GPUs with traces: a trace is not modelled. With the cross-kernel
prefetch checked, the step's anatomy shows the modelled bound and the step as learned from the
prefetch's recordings (kvlab.predict.ahead: the H100's and the H200's own, another GPU's by the
H200's, which the status line says), and the status line lists the steps recorded with it off
and on at the chosen model and batch.
"""

from __future__ import annotations

import html
import statistics

import ipywidgets as widgets

from kvlab.bench.e2e import VARIANTS, ahead_kv_bytes, prefetch_pairs
from kvlab.bench.steptrace import mean_context, share_text
from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.gpus import GPUS, REFERENCE, copy_roofline_gbps
from kvlab.panels.widgets import (
    control_grid,
    figure_widget,
    gpu_control,
    gpu_here,
    labeled,
    modelled_for,
    show_figure,
)
from kvlab.predict.ahead import (
    AHEAD_RECORDED,
    KV_COUNTERS,
    KV_LEVER,
    KV_RECORDED,
    KV_RUNS,
    LEVER,
    LEVER_RUNS,
    ahead_effect,
    counter_pairs,
    fit_ahead,
    fit_kv_ahead,
    kv_ahead_effect,
    kv_pairs,
    lever_pairs,
)
from kvlab.predict.point import launch_point
from kvlab.predict.step import (
    STREAMING_ROWS,
    ahead_size,
    fit_step_model,
    recorded_folded,
    step_anatomy,
)
from kvlab.results import E2E, label, load_result, load_shown, recorded_models
from kvlab.viz.e2e import (
    TITLES,
    anatomy_figure,
    is_hf,
    modelled_rows,
    steps_figure,
    tensor_parallel_figure,
    throughput_figure,
    trace_figure,
    trace_groups,
)
from kvlab.viz.layout import note_figure, note_text, unreadable_figure

RECORDED = E2E  # 256 new tokens (e2e_2048: 2,048)
SERVING = ("h200", ("e2e_serving",))  # its `serving` entries; its one row only loads the model
# tensor-parallel runs of N GPUs (rows with "tp": N), the prefetch paper's section 5.5
TENSOR_PARALLEL = tuple((f"h200x{n}", ("e2e",)) for n in (2, 4, 8))
# What the tab reads of the recordings (`kvlab.results.load_result`'s keys)
E2E_ROWS = ("model", "variant", "batch", "prompt", "new_tokens", "step_ms", "tokens_per_s",
            "step_ms_runs", "roofline_ms", "ratio_to_roofline")
SERVING_KEYS = {"serving": ("model", "variant", "rate", "requests", "output_tokens_per_s",
                            "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "preemptions")}
# One decode step traced kernel by kernel at 512, 4k and 32k tokens, and ncu's L2 hits of its
# GEMMs (the weights' prefetch) and of its attention (the K/V blocks'): the recordings a GPU's view
# reads where they exist, from the results folder TRACED gives its kvlab.gpus key
STEP_TRACES = ("steptrace", "steptrace_4k", "steptrace_32k")
STEP_COUNTERS = (*AHEAD_RECORDED["h100-sxm"]["counters"][1], *KV_COUNTERS[1])
TRACED = {"h100-sxm": "h100", REFERENCE: "h200"}
TRACE_ROWS = ("model", "batch", "ahead_bytes", "prompt", "new_tokens", "steps", "num_kernels",
              "span_us", "gap_us", "roofline_us", "kernels")
TRACE_COMMAND = ("python -m kvlab bench steptrace --models {model} --batches {batch}",
                 "--json benchmarks/results/<gpu>/steptrace.json")  # lines of a note
FIGURE_HEIGHTS = {"throughput": 420, "steps": 360, "tensor_parallel": 360, "anatomy": 420,
                  "trace": 420}
PROMPT_TOKENS = 512
RECORD_COMMAND = "python -m kvlab bench e2e --json benchmarks/results/h200/e2e.json"
TP_COMMAND = ("torchrun --nproc-per-node N -m kvlab bench e2e --tp N",  # lines of a note
              "--models llama3-8b qwen2.5-14b", "--json benchmarks/results/h200xN/e2e.json")
MODELLED = "its roofline step x the H200's ratio of step to roofline step"  # a subtitle line
# a lever row's same_tokens (its greedy tokens against those without the lever), in words
TOKENS_CHECK = {True: "the same", False: "not the same", None: "not compared"}

__all__ = ["EndToEndTab"]


class EndToEndTab:
    """Decode throughput of whole models (figures: throughput, steps, tensor_parallel).

    controls: model, gpu (a key of kvlab.gpus.GPUS; default `gpu_control`'s), batch (the
    recorded ones); on the "cuda" backend also new_tokens, and `generate_button` runs kvlab.LLM
    at the chosen model and batch on the GPU in use (`local_gpu`: the gpu control's entry its run
    shows under), enabled while the gpu control names it (on "sim" it is None). `generated`
    holds the last run: (model, batch, kvlab.engine.Generation). A recording that cannot be read
    (`unreadable`: "recorded", "serving", the machine of a tensor-parallel run, and once
    `traces` has loaded them "traced (<machine>)" or "step counters (<machine>)" -> why) is
    named, with why, where it would be shown. A model or batch not recorded falls back to a
    recorded one; raises ValueError for `new_tokens` outside [2, 2048] on "cuda", or a `gpu`
    not in kvlab.gpus.GPUS."""

    key = "e2e"
    title = "End-to-end"

    def __init__(self, model: str = "llama3-8b", batch: int = 64, new_tokens: int = 64,
                 gpu: str | None = None):
        self.backend = backend()
        self.local_gpu = gpu_here() if self.backend == "cuda" else None
        self.unreadable: dict[str, str] = {}
        self.recorded = load_shown(*RECORDED, {"roofline_copy_gbps": float, "rows": E2E_ROWS},
                                   self.unreadable, "recorded") or {"rows": []}
        # each run's copy roofline (GB/s): its rows' roofline steps are their bytes over it
        self.run_gbps = {name: load_result(RECORDED[0], name)["roofline_copy_gbps"]
                         for name in self.recorded.get("source_dates", {})}
        self.serving = load_shown(*SERVING, SERVING_KEYS, self.unreadable,
                                  "serving") or {"serving": []}
        try:  # the step's anatomy: its constants, fitted on the recorded steps
            self.step_model = fit_step_model()
        except (OSError, ValueError, KeyError, TypeError) as error:
            self.step_model = f"the step model cannot be fitted: {error}"
        self._traces: dict = {}  # a GPU's traced steps and their counters: `traces`
        # the learned prefetches, per kind and GPU learned on: `_learned_model`
        self._learned_models: dict = {}
        self._lever_runs = None  # its recorded runs, name -> result or why unreadable
        self.tensor_parallel = [  # the recorded tensor-parallel results
            result for machine, names in TENSOR_PARALLEL
            if (result := load_shown(machine, names, {"tp": int, "rows": E2E_ROWS},
                                     self.unreadable, machine))]
        recorded = recorded_models(self.recorded)
        models = [*recorded, *(m for m in MODELS if m not in recorded)]
        batches = sorted({r["batch"] for r in self.recorded["rows"]}) or [batch]
        self.controls = {
            "model": labeled(widgets.Dropdown, "model", options=models,
                             value=model if model in models else models[0]),
            "gpu": gpu_control(gpu),
            "batch": labeled(widgets.Dropdown, "batch", options=batches,
                             value=batch if batch in batches else batches[-1]),
            "ahead": labeled(widgets.Checkbox, "cross-kernel prefetch (modelled)",
                             value=False, indent=False),
        }
        if self.backend == "cuda":  # for Generate
            self.controls["new_tokens"] = labeled(widgets.BoundedIntText, "new tokens",
                                                  name="new_tokens", min=2, max=2048,
                                                  value=new_tokens)
        self.figures = {name: figure_widget(h) for name, h in FIGURE_HEIGHTS.items()}
        self.status = widgets.HTML()
        self.generated = None
        self._llms: dict[str, object] = {}
        self.generate_button = None
        if self.backend == "cuda":
            self.generate_button = widgets.Button(description="Generate", button_style="primary")
            self.generate_button.on_click(self.generate)
        for name in ("model", "gpu", "batch", "ahead"):
            self.controls[name].observe(self.refresh, names="value")
        buttons = [self.generate_button] if self.generate_button is not None else []
        self.widget = widgets.VBox([control_grid(list(self.controls.values())),
                                    widgets.HBox(buttons), self.status,
                                    *self.figures.values()])
        self.refresh()

    def generate(self, button=None) -> None:
        """Run kvlab.LLM on this GPU at the chosen model and batch, then show its steps."""
        import torch

        import kvlab

        model, batch = self.controls["model"].value, self.controls["batch"].value
        new_tokens = self.controls["new_tokens"].value
        llm = self._llms.get(model)
        if llm is None:
            self._llms.clear()  # one model's weights on the GPU at a time
            llm = self._llms[model] = kvlab.LLM(model)
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, llm.model.vocab_size, (batch, PROMPT_TOKENS),
                                generator=gen).tolist()
        self.generated = (model, batch, llm.generate(prompts, new_tokens, ignore_eos=True))
        self.refresh()

    def _show_tensor_parallel(self, model: str, batch: int, rows: list[dict], gpu: str
                              ) -> list[str]:
        """Draw `model`'s tensor-parallel runs at `batch` beside its one-GPU `rows`, or say how
        to record them, or for a GPU but the H200 that they are not modelled; the status lines:
        the prefetch's gain at each GPU count."""
        height = FIGURE_HEIGHTS["tensor_parallel"]
        title = TITLES["tensor_parallel"].format(model=model, batch=batch)
        if gpu != REFERENCE:
            show_figure(self.figures["tensor_parallel"], note_figure(
                title, modelled_for(gpu), f"tensor-parallel runs are the "
                f"{GPUS[REFERENCE].name}'s recordings only:<br>the links between GPUs are "
                "outside this model", height))
            return []
        runs = [(result, [r for r in result["rows"] if r["model"] == model
                          and r["batch"] == batch and not is_hf(r["variant"])])
                for result in self.tensor_parallel]
        runs = [(result, tp_rows) for result, tp_rows in runs if tp_rows]
        unreadable = [why for machine, _ in TENSOR_PARALLEL
                      if (why := self.unreadable.get(machine))]
        if not runs and unreadable:
            show_figure(self.figures["tensor_parallel"], unreadable_figure(
                title, unreadable[0], height))
            return []
        if not runs:
            show_figure(self.figures["tensor_parallel"], note_figure(
                title, "not recorded on the H200 with 2 to 8 GPUs",
                "the prefetch paper's section 5.5 (2, 4 and 8 GPUs, with and without<br>"
                "prefetch) needs a machine of 2 to 8 GPUs:<br>"
                + "<br>".join(TP_COMMAND),
                height))
            return []
        one_gpu = [r for r in rows if r["batch"] == batch]
        provenance = "; ".join([f"1 GPU {label(self.recorded, one_gpu)}", *(
            f"{result['tp']} GPUs recorded on {result['tp']} x {result.get('gpu', 'unknown GPU')}"
            f", {str(result.get('date', 'unknown date'))[:10]}" for result, _ in runs)])
        show_figure(self.figures["tensor_parallel"], tensor_parallel_figure(
            one_gpu + [r for _, tp_rows in runs for r in tp_rows], model, batch, provenance,
            height))
        return [f"The paper's prefetch on {result['tp']} GPUs: " + ", ".join(gains)
                for result, tp_rows in runs if (gains := _prefetch_gains(tp_rows))]

    def _serving_lines(self, model: str) -> list[str]:
        """The recorded serving runs of `model`, one line each."""
        runs = [r for r in self.serving["serving"] if r["model"] == model]
        return [f"Serving {r['requests']} requests arriving at {r['rate']:g}/s "
                f"({html.escape(r['variant'])}, {html.escape(label(self.serving))}): "
                f"{r['output_tokens_per_s']:,.0f} output tokens/s, time per output token p50 "
                f"{r['tpot_ms_p50']:.1f} ms, p99 {r['tpot_ms_p99']:.1f} ms, first token p50 "
                f"{r['ttft_ms_p50']:,.0f} ms, {r['preemptions']} "
                f"preemption{'' if r['preemptions'] == 1 else 's'}" for r in runs]

    def refresh(self, change=None) -> None:
        """Show the chosen model and batch: for the H200 as recorded (with the run generated
        here, if any), for another GPU as modelled for it."""
        model, batch, gpu = (self.controls[name].value for name in ("model", "batch", "gpu"))
        rows = [r for r in self.recorded["rows"] if r["model"] == model]
        unreadable = [f"unreadable recording: {why}" for why in self.unreadable.values()]
        titles = {name: title.format(model=model, batch=batch) for name, title in TITLES.items()}
        modelled = gpu != REFERENCE
        if self.generate_button is not None:
            self.generate_button.disabled = gpu != self.local_gpu
        if not rows and "recorded" in self.unreadable:
            for name, height in FIGURE_HEIGHTS.items():
                show_figure(self.figures[name], unreadable_figure(
                    titles[name], self.unreadable["recorded"], height))
            self.status.value = "<br>".join(map(html.escape, unreadable))
            return
        if not rows:
            self._show_notes(titles, modelled_for(gpu) if modelled else "not recorded on the H200",
                             f"no run of {html.escape(model)} on the H200"
                             f"{' to model from' if modelled else ''}: record one on a GPU with"
                             f"<br>{RECORD_COMMAND}")
            self.status.value = "<br>".join([
                f"No end-to-end run of {html.escape(model)} "
                f"{'on the H200 to model from' if modelled else 'recorded'}.",
                *map(html.escape, unreadable)])
            return
        past, lines = {}, []
        if modelled:
            rows, past, lines = self._modelled(model, batch, gpu, rows)
            provenance, where = f"{modelled_for(gpu)}<br>{MODELLED}", modelled_for(gpu)
        else:
            provenance = where = label(self.recorded, rows)
        if rows:
            show_figure(self.figures["throughput"], throughput_figure(
                rows, model, provenance, FIGURE_HEIGHTS["throughput"]))
        else:  # no batch fits
            show_figure(self.figures["throughput"], note_figure(
                titles["throughput"], provenance, "every batch is past the GPU's memory:<br>"
                "see the status line", FIGURE_HEIGHTS["throughput"]))
        at_batch = [r for r in rows if r["batch"] == batch]
        anatomy = []
        if at_batch:
            lines = self._show_steps(model, batch, gpu, at_batch, where, provenance) + lines
            anatomy = self._show_anatomy(model, batch, gpu, at_batch)
        else:
            why = past.get(batch, f"no run of {model} at batch {batch}")
            for name in ("steps", "anatomy"):
                show_figure(self.figures[name], note_figure(
                    titles[name], provenance, note_text(why), FIGURE_HEIGHTS[name]))
            lines.insert(0, html.escape(why))
        lines += (self._show_tensor_parallel(model, batch, rows, gpu) + anatomy
                  + self._show_trace(model, batch, gpu))
        if not modelled:
            lines += self._serving_lines(model)
        lines += map(html.escape, unreadable)
        self.status.value = "<br>".join(lines)

    def _show_notes(self, titles: dict[str, str], provenance: str, note: str) -> None:
        """`note` in place of every figure."""
        for name, height in FIGURE_HEIGHTS.items():
            show_figure(self.figures[name], note_figure(titles[name], provenance, note, height))

    def _show_anatomy(self, model: str, batch: int, gpu: str, rows: list[dict]) -> list[str]:
        """Draw one step kernel by kernel (kvlab.predict.step), at the prompt and new tokens of
        `rows` (the recorded batch), on the chosen GPU's copy roofline (the H200's: that of the
        run recorded), with gqa's recorded step beside it; the status line on its idle budget."""
        title = TITLES["anatomy"].format(model=model, batch=batch)
        height = FIGURE_HEIGHTS["anatomy"]
        fit = self.step_model
        if isinstance(fit, str):
            show_figure(self.figures["anatomy"], note_figure(title, "not modelled",
                                                             note_text(fit), height))
            return [html.escape(fit)]
        gqa = next((r for r in rows if r["variant"] == "gqa"), None)
        prompt, new_tokens = ((gqa["prompt"], gqa["new_tokens"]) if gqa is not None
                              else (PROMPT_TOKENS, PROMPT_TOKENS // 2))
        if gpu == REFERENCE and gqa is not None and gqa.get("source") in self.run_gbps:
            gbps, recorded = self.run_gbps[gqa["source"]], gqa["step_ms"]
        else:
            gbps, recorded = copy_roofline_gbps(gpu)[0], None
        overhead = (fit.streaming_overhead_us if batch <= STREAMING_ROWS else fit.overhead_us)
        provenance = (f"{modelled_for(gpu) if gpu != REFERENCE else 'modelled'}: "
                      f"{overhead:.1f} us idle a modelled kernel at this batch, "
                      f"{fit.per_sequence_us:.2f} us a sequence and layer, fitted on the "
                      f"{GPUS[REFERENCE].name}'s steps (within {fit.held_out_error:.0%} on "
                      "models left out)")
        ahead = ahead_size(fit, gbps, batch) if self.controls["ahead"].value else 0
        try:
            anatomy = step_anatomy(model, batch, prompt + new_tokens / 2, gbps, fit, ahead)
        except ValueError as error:
            show_figure(self.figures["anatomy"], note_figure(title, "not modelled",
                                                             note_text(str(error)), height))
            return [html.escape(f"Step anatomy: {error}")]
        learned = self._learned(model, batch, prompt + new_tokens / 2, gbps, ahead, gpu)
        show_figure(self.figures["anatomy"], anatomy_figure(
            anatomy, title, provenance, recorded, height,
            None if isinstance(learned, str) else (anatomy["step_us"] + anatomy["hidden_us"]
                                                   + learned["delta_us"]) / 1e3))
        lines = [
            f"Idle budget (modelled): {anatomy['idle_us'] / 1e3:.2f} ms of a "
            f"{anatomy['step_us'] / 1e3:.2f} ms step, "
            f"{anatomy['idle_us'] / anatomy['step_us']:.0%}: HBM idles between and around "
            "the kernels, an estimate of what prefetching the next kernel's operands into L2 "
            "could win back (modelled, not traced kernel by kernel)"]
        if ahead:
            lines.append(
                f"Cross-kernel prefetch (kvlab.LLM(ahead_bytes={ahead:,})): at most "
                f"{anatomy['hidden_us'] / 1e3:.2f} ms of idle hidden, the kernels before each "
                f"covered GEMM bringing its first {ahead / 2**20:.1f} MiB into L2 "
                "(a modelled bound, not measured: docs/end-to-end.md)")
            lines.append(learned if isinstance(learned, str) else _learned_line(
                learned, anatomy["step_us"] + anatomy["hidden_us"], self.ahead_model(gpu), gpu))
            if batch <= STREAMING_ROWS:
                lines.append(self._kv_line(model, batch, prompt + new_tokens, gbps, gpu))
            lines += self._lever_lines(model, batch)
        return list(map(html.escape, lines))

    def _kv_line(self, model: str, batch: int, tokens: int, gbps: float, gpu: str) -> str:
        """The status line on the K/V blocks' prefetch at `batch` sequences of `model` ending at
        `tokens`, sized as bench e2e sizes it: its learned change of a step on `gpu` (the
        H200's model on a GPU without recordings), or why it cannot be fitted."""
        learned = self._learned_model("kv", gpu, KV_RECORDED, "it cannot be fitted")
        size = ahead_kv_bytes(MODELS[model], batch, tokens, GPUS[gpu].l2_bytes)
        head = (f"K/V blocks' prefetch (kvlab.LLM(ahead_kv_bytes={size:,})), each layer's QKV "
                "linear bringing its K/V into L2 for the attention")
        if isinstance(learned, str):
            return f"{head}: {learned}"
        return (f"{head}, learned from the recordings "
                f"({learned.sources}{_assumed(gpu, KV_RECORDED)}): "
                f"{kv_ahead_effect(model, size, gbps, learned) / 1e3:+.2f} ms a step, "
                f"{learned.net_cost:.0%} of the prefetched bytes' time at the copy roofline "
                f"(HBM is busy in the drain it moves them to); within "
                f"{learned.held_out_us:.0f} us on models left out (kvlab.predict.ahead)")

    def _lever_lines(self, model: str, batch: int) -> list[str]:
        """The steps recorded with each cross-kernel prefetch off and on in one loop
        (LEVER_RUNS and KV_RUNS: bench e2e's, every GPU's) at `model` and `batch`, one line
        each; a run that cannot be read says why once."""
        if self._lever_runs is None:
            self._lever_runs = {}
            for _, machine, name in dict.fromkeys(LEVER_RUNS + KV_RUNS):
                try:
                    self._lever_runs[f"{machine}/{name}"] = load_result(machine, name,
                                                                        {"rows": E2E_ROWS})
                except ValueError as error:
                    self._lever_runs[f"{machine}/{name}"] = str(error)
        lines = []
        for name, result in self._lever_runs.items():
            if isinstance(result, str):
                lines.append(f"Unreadable recording of the cross-kernel prefetch: {result}")
                continue
            for lever, what, size, unit in (
                    (LEVER, "the cross-kernel prefetch", "ahead_bytes", "MiB"),
                    (KV_LEVER, "the K/V blocks' prefetch", "ahead_kv_bytes",
                     "MiB of K/V a layer")):
                lines += [f"Measured with {what} off and on in one loop ({name}, "
                          f"{label(result, [on])}), prompts of {base['prompt']:,} tokens: "
                          f"{lever} at {base['step_ms'] / on['step_ms']:.3f}x "
                          f"{base['variant']}'s speed ({on[size] / 2**20:.1f} {unit}), "
                          f"greedy tokens {TOKENS_CHECK[on.get('same_tokens')]}"
                          for base, on in lever_pairs(result, lever=lever)
                          if (base["model"], base["batch"]) == (model, batch)]
        return lines

    def ahead_model(self, gpu: str):
        """The cross-kernel prefetch learned from the recordings of `gpu`, or of the H200 for a
        GPU without (kvlab.predict.ahead.fit_ahead, on this tab's step model), or why it cannot
        be fitted; fitted the first time asked."""
        return self._learned_model("weights", gpu, AHEAD_RECORDED,
                                   "the learned prefetch cannot be fitted")

    def _learned_model(self, kind: str, gpu: str, recorded: dict, why: str):
        """The prefetch of `kind` ("weights": fit_ahead on this tab's step model, "kv":
        fit_kv_ahead) learned from the recordings of `gpu`, or of the H200 for a GPU not in
        `recorded`; or `why` it cannot be fitted, with the error. Fitted the first time asked."""
        learned_on = gpu if gpu in recorded else REFERENCE
        if (kind, learned_on) not in self._learned_models:
            try:
                found = (fit_ahead(learned_on, step=self.step_model) if kind == "weights"
                         else fit_kv_ahead(learned_on))
            except (OSError, ValueError, KeyError, TypeError) as error:
                found = f"{why}: {error}"
            self._learned_models[kind, learned_on] = found
        return self._learned_models[kind, learned_on]

    def _learned(self, model: str, batch: int, context: float, gbps: float, ahead: int,
                 gpu: str):
        """kvlab.predict.ahead.ahead_effect of `ahead` bytes at this point on `gpu` (its L2), or
        why there is none (no prefetch: "")."""
        if not ahead:
            return ""
        learned = self.ahead_model(gpu)
        if isinstance(learned, str):
            return learned
        return ahead_effect(model, batch, context, ahead, gbps, self.step_model, learned,
                            GPUS[gpu].l2_bytes)

    def traces(self, gpu: str) -> tuple[dict, dict[str, tuple[float, bool]], dict]:
        """The traced steps of `gpu` (a key of TRACED; merged), each file's copy roofline (GB/s)
        and whether its steps ran the norms and RoPE in the linears
        (kvlab.predict.step.recorded_folded), and its step counters, loaded the first time they
        are asked for (megabytes of kernels that only that GPU's view draws)."""
        if gpu not in self._traces:
            machine = TRACED[gpu]
            traced = load_shown(machine, STEP_TRACES,
                                {"roofline_copy_gbps": float, "rows": TRACE_ROWS},
                                self.unreadable, f"traced ({machine})") or {"rows": []}
            files = {name: load_result(machine, name) for name in traced.get("source_dates", {})}
            runs = {name: (f["roofline_copy_gbps"], recorded_folded(f))
                    for name, f in files.items()}
            counters = load_shown(machine, STEP_COUNTERS, {"rows": TRACE_ROWS}, self.unreadable,
                                  f"step counters ({machine})") or {"rows": []}
            self._traces[gpu] = (traced, runs, counters)
        return self._traces[gpu]

    def _show_trace(self, model: str, batch: int, gpu: str) -> list[str]:
        """For a GPU with traces (TRACED), draw its recorded trace of one step of `model` at
        `batch` kernel by kernel (the shortest prompts traced, without the cross-kernel
        prefetch), or say how to record one; the status lines: each traced prompt length's step
        against its roofline and its gaps, and its ncu L2 hits of the GEMMs' loads with and
        without the cross-kernel prefetch (and of the attention's, with and without the K/V
        blocks'). For another GPU, a note that names the GPUs with traces (a trace is not
        modelled)."""
        title = TITLES["trace"].format(model=model, batch=batch)
        height = FIGURE_HEIGHTS["trace"]
        if gpu not in TRACED:
            where = " and ".join(f"the {GPUS[key].name}" for key in TRACED)
            show_figure(self.figures["trace"], note_figure(
                title, modelled_for(gpu),
                note_text(f"A step traced kernel by kernel is recorded on {where} only: choose "
                          "one in the GPU control. To trace one on a GPU:") + "<br>"
                + "<br>".join(map(html.escape, TRACE_COMMAND)).format(model=model, batch=batch),
                height))
            return []
        recorded, runs, _ = self.traces(gpu)
        traced = sorted((r for r in recorded["rows"] if r["model"] == model
                         and r["batch"] == batch and not r["ahead_bytes"]),
                        key=lambda r: r["prompt"])
        if not traced:
            why = self.unreadable.get(f"traced ({TRACED[gpu]})")
            show_figure(self.figures["trace"], unreadable_figure(title, why, height) if why
                        else note_figure(title, "not traced, not modelled", note_text(
                            f"no step of {model} at batch {batch} traced kernel by kernel; "
                            "record one on a GPU with:") + "<br>" + "<br>".join(
                            map(html.escape, TRACE_COMMAND)).format(model=model, batch=batch),
                            height))
            return []
        row = traced[0]
        anatomy = None
        if not isinstance(self.step_model, str):
            context = mean_context(row["prompt"], row["new_tokens"], len(row["steps"]))
            gbps, folded = runs[row["source"]]
            anatomy = step_anatomy(model, batch, context, gbps, self.step_model, folded=folded)
        provenance = f"{label(recorded, [row])}; prompts of {row['prompt']:,} tokens"
        show_figure(self.figures["trace"], trace_figure(
            row, trace_groups(row["kernels"], anatomy), title, provenance, height))
        where = recorded.get("gpu", "a GPU")
        lines = [f"Traced step ({where}, prompts of {r['prompt']:,} tokens): "
                 f"{r['span_us'] / 1e3:.2f} ms, {r['span_us'] / r['roofline_us']:.2f}x its "
                 f"bytes at the copy roofline ({r['roofline_us'] / 1e3:.2f} ms); "
                 f"{r['gap_us'] / 1e3:.2f} ms between its {r['num_kernels']:.0f} kernels"
                 + (f", {r['gap_us'] / excess:.0%} of the time beyond the roofline: the rest "
                    "is inside the kernels (ramps, tails, reads below the copy rate)"
                    if (excess := r["span_us"] - r["roofline_us"]) > 0 else "")
                 for r in traced]
        return list(map(html.escape, lines + self._counter_lines(model, batch, gpu)))

    def _counter_lines(self, model: str, batch: int, gpu: str) -> list[str]:
        """ncu's share of each GEMM's loaded bytes that hit L2 in a step of `model` at `batch` on
        `gpu` (a key of TRACED), without and with the cross-kernel prefetch, beside the share the
        step model gives the prefetch (kvlab.predict.step.ahead_hits): one line per prefetch size
        recorded (kvlab.predict.ahead.counter_pairs); and the attention's, without and with the
        K/V blocks' prefetch (kvlab.predict.ahead.kv_pairs). None where `gpu` has none recorded."""
        counters = self.traces(gpu)[2]
        shown = [r for r in counters["rows"] if r["model"] == model and r["batch"] == batch]
        lines = [f"L2 hits of the attention's loads (ncu, {label(counters, [on])}, "
                 f"{on['prompt']:,} tokens), without -> with the K/V blocks' prefetch of "
                 f"{on['ahead_kv_bytes'] / 2**20:.0f} MiB: "
                 f"{share_text(base['counters']['attention']['load_hit_share'])} -> "
                 f"{share_text(on['counters']['attention']['load_hit_share'])} (it covers "
                 f"{on['counters']['attention']['prefetched_share']:.0%} of a layer's K and V)"
                 for base, on in kv_pairs({"rows": shown})]
        for without, r in counter_pairs({"rows": shown}):
            before = {g["name"]: g["load_hit_share"] for g in without["counters"]["gemms"]}
            shares = ", ".join(
                f"{g['name']} {share_text(before.get(g['name']))} -> "
                f"{share_text(g['load_hit_share'])}"
                f" (modelled +{g['prefetched_share']:.0%})" for g in r["counters"]["gemms"])
            lines.append(f"L2 hits of the GEMMs' loads (ncu, {label(counters, [r])}, "
                         f"{r['prompt']:,} tokens), without -> with the cross-kernel prefetch of "
                         f"{r['ahead_bytes'] / 2**20:.0f} MiB: {shares}")
        return lines

    def _modelled(self, model: str, batch: int, gpu: str, rows: list[dict]
                  ) -> tuple[list[dict], dict[int, str], list[str]]:
        """`rows` modelled for `gpu` (`modelled_rows`) but for the variants it cannot run
        (kvlab.predict.point.launch_point's ValueError); why each batch past its memory is left
        out; and the status lines on what is assumed and left out (batches but `batch`)."""
        cannot = {}
        for variant in dict.fromkeys(r["variant"] for r in rows):
            if variant in VARIANTS:  # HF's static cache: any GPU
                kernel, prefetch, _ = VARIANTS[variant]
                try:
                    launch_point(model, 1, 1, family=kernel, prefetch=prefetch, gpu_key=gpu)
                except ValueError as error:
                    cannot[variant] = str(error)
        shown, past = modelled_rows([r for r in rows if r["variant"] not in cannot],
                                    self.run_gbps, gpu)
        gbps, why = copy_roofline_gbps(gpu)
        lines = [f"Copy roofline of the {GPUS[gpu].name}: {gbps:,.0f} GB/s, {why}.",
                 *(f"{variant} left out: {error}" for variant, error in cannot.items()),
                 *(f"{why}: left out" for b, why in past.items() if b != batch)]
        return shown, past, list(map(html.escape, lines))

    def _show_steps(self, model: str, batch: int, gpu: str, rows: list[dict], where: str,
                    provenance: str) -> list[str]:
        """Draw the steps of `rows` (one batch), with the run generated here where it is of
        this model, batch and GPU; the status lines: the fastest variant, the run generated,
        and for the H200 the prefetch's gain (elsewhere, how the step is modelled)."""
        title, source, lines = TITLES["steps"].format(model=model, batch=batch), provenance, []
        steps = {r["variant"]: r["step_ms_runs"] for r in rows}
        if self.generated is not None and self.generated[:2] == (model, batch) and (
                gpu == self.local_gpu):
            out = self.generated[2]
            name = f"kvlab.LLM ({out.attention}), now"
            steps = {name: out.step_ms, **steps}
            source = f"{name}: measured on {device_label()}; the rest {provenance}"
            lines.append(f"Generated now: {len(out.step_ms)} steps, median "
                         f"{statistics.median(out.step_ms):.2f} ms, "
                         f"{out.decode_tokens_per_s:,.0f} tokens/s; request 0's first tokens "
                         f"{html.escape(str(out.tokens[0][:12]))}")
        try:
            figure = steps_figure(steps, title, source, f"prompts of {rows[0]['prompt']} tokens",
                                  FIGURE_HEIGHTS["steps"])
        except ValueError as error:  # a recorded run without its steps
            figure = note_figure(title, source, html.escape(str(error)), FIGURE_HEIGHTS["steps"])
        show_figure(self.figures["steps"], figure)
        best = min((r for r in rows if not is_hf(r["variant"])), key=lambda r: r["step_ms"])
        hf = next((r for r in rows if r["variant"] == "hf-static"), None)
        versus = (f", {hf['step_ms'] / best['step_ms']:.2f}x HF's static cache"
                  if hf is not None else "")
        first = (f"{html.escape(model)} batch {batch} ({html.escape(where)}): fastest "
                 f"{html.escape(best['variant'])} {best['step_ms']:.2f} ms a step, "
                 f"{best['tokens_per_s']:,.0f} tokens/s, {best['ratio_to_roofline']:.2f}x the "
                 f"roofline step{versus}")
        if gpu != REFERENCE:
            lines.append(html.escape(
                f"Modelled step: the roofline step on the {GPUS[gpu].name} times the "
                f"{GPUS[REFERENCE].name}'s measured ratio to its own at batch {batch}, "
                f"{best['prompt']} + {best['new_tokens']} tokens (assumed to hold): "
                f"{best['step_bytes'] / 1e9:,.2f} GB a step / "
                f"{copy_roofline_gbps(gpu)[0]:,.0f} GB/s = {best['roofline_ms']:.2f} ms, "
                f"x {best['ratio_to_roofline']:.2f} = {best['step_ms']:.2f} ms "
                f"({best['variant']})."))
        else:
            for lever, what in (("+prefetch", "The paper's prefetch"),
                                ("+ahead", "The cross-kernel prefetch")):
                if gains := _prefetch_gains(rows, lever):
                    lines.append(f"{what} at this batch: " + ", ".join(gains))
        return [first, *lines]


def _prefetch_gains(rows: list[dict], lever: str = "+prefetch") -> list[str]:
    """Each variant with `lever` (bench.e2e.LEVERS) against the same kernel without it among
    `rows` (one batch of one run), as "<with> 0.98x <without>'s speed"."""
    step_ms = {r["variant"]: r["step_ms"] for r in rows}
    return [f"{html.escape(with_)} {step_ms[without] / step_ms[with_]:.2f}x "
            f"{html.escape(without)}'s speed"
            for with_, without in prefetch_pairs(step_ms, lever)]


def _assumed(gpu: str, recorded: dict) -> str:
    """What a learned model's sources add for a GPU not in `recorded`: the H200's model is
    assumed for it ("" for a GPU with recordings of its own)."""
    return ("" if gpu in recorded else
            f", the {GPUS[REFERENCE].name}'s model assumed for the {GPUS[gpu].name}")


def _learned_line(effect: dict, step_us: float, learned, gpu: str) -> str:
    """The status line on the learned prefetch's effect (`ahead_effect`) on a step of
    `step_us` without it, on `gpu`."""
    delivery = ", ".join(f"{regime} {share:.0%}" for regime, share in learned.delivery.items())
    cost = ", ".join(f"{key} {share:.0%}" for key, share in learned.issue_cost.items())
    return (f"Learned from the recordings ({learned.sources}{_assumed(gpu, AHEAD_RECORDED)}): "
            f"{effect['delta_us'] / 1e3:+.2f} ms a step "
            f"({effect['delta_us'] / step_us:+.1%}): the issuing kernels grow by "
            f"{effect['cost_us'] / 1e3:.2f} ms, the GEMMs after them hide "
            f"{effect['hidden_us'] / 1e3:.2f} ms of idle. Share of the prefetched bytes found in "
            f"L2 (ncu): {delivery}; issuing kernels' growth, of the bytes' time: {cost}; within "
            f"{learned.held_out_us:.0f} us of the recorded change on models left out "
            "(kvlab.predict.ahead)")
