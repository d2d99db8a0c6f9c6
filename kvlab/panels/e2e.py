"""The "End-to-end" tab: decode tokens/s of whole models against batch, per attention variant,
beside HF transformers' static cache and the roofline; the time of each decode step; and
tokens/s against the number of GPUs a tensor-parallel run splits the model over.

Wiring only. The recorded H200 results (`results/h200/e2e.json`, `e2e_qwen7b.json`,
`e2e_qwen14b.json`, and the serving runs of `e2e_serving.json` in the status line) are shown on
any machine, labelled so, and so are the tensor-parallel runs where they are recorded
(`results/h200x<N>/e2e.json`, N GPUs of one machine). On a GPU a Generate button runs
`kvlab.LLM` (seeded random weights of the model, attention "auto", CUDA graphs) on the chosen
batch of 512-token prompts and adds its steps, labelled "measured on <GPU>"; torch loads only
then.
"""

from __future__ import annotations

import html
import statistics

import ipywidgets as widgets

from kvlab.bench.e2e import prefetch_pairs
from kvlab.config import MODELS
from kvlab.device import backend, device_label
from kvlab.panels.widgets import control_grid, figure_widget, labeled, show_figure
from kvlab.results import label, load_shown, recorded_models
from kvlab.viz.e2e import TITLES, steps_figure, tensor_parallel_figure, throughput_figure
from kvlab.viz.layout import note_figure, unreadable_figure

RECORDED = ("h200", ("e2e", "e2e_qwen7b", "e2e_qwen14b"))  # 256 new tokens (e2e_2048: 2,048)
SERVING = ("h200", ("e2e_serving",))  # its `serving` entries; its one row only loads the model
# tensor-parallel runs of N GPUs (rows with "tp": N), the prefetch paper's section 5.5
TENSOR_PARALLEL = tuple((f"h200x{n}", ("e2e",)) for n in (2, 4, 8))
# What the tab reads of the recordings (`kvlab.results.load_result`'s keys)
E2E_ROWS = ("model", "variant", "batch", "prompt", "new_tokens", "step_ms", "tokens_per_s",
            "step_ms_runs", "roofline_ms", "ratio_to_roofline")
SERVING_KEYS = {"serving": ("model", "variant", "rate", "requests", "output_tokens_per_s",
                            "tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "preemptions")}
FIGURE_HEIGHTS = {"throughput": 420, "steps": 360, "tensor_parallel": 360}
PROMPT_TOKENS = 512
RECORD_COMMAND = "python -m kvlab bench e2e --json benchmarks/results/h200/e2e.json"
TP_COMMAND = ("torchrun --nproc-per-node N -m kvlab bench e2e --tp N",  # lines of a note
              "--models llama3-8b qwen2.5-14b", "--json benchmarks/results/h200xN/e2e.json")

__all__ = ["EndToEndTab"]


class EndToEndTab:
    """Decode throughput of whole models (figures: throughput, steps, tensor_parallel).

    controls: model, batch (the recorded ones); on the "cuda" backend also new_tokens, and
    `generate_button` runs kvlab.LLM at the chosen model and batch (on "sim" it is None).
    `generated` holds the last run: (model, batch, kvlab.engine.Generation). A recording that
    cannot be read (`unreadable`: "recorded", "serving" or the machine of a tensor-parallel run
    -> why) is named, with why, where it would be shown. A model or batch not recorded falls back
    to a recorded one; raises ValueError for `new_tokens` outside [2, 2048] on "cuda"."""

    key = "e2e"
    title = "End-to-end"

    def __init__(self, model: str = "llama3-8b", batch: int = 64, new_tokens: int = 64):
        self.backend = backend()
        self.unreadable: dict[str, str] = {}
        self.recorded = load_shown(*RECORDED, {"rows": E2E_ROWS}, self.unreadable,
                                   "recorded") or {"rows": []}
        self.serving = load_shown(*SERVING, SERVING_KEYS, self.unreadable,
                                  "serving") or {"serving": []}
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
            "batch": labeled(widgets.Dropdown, "batch", options=batches,
                             value=batch if batch in batches else batches[-1]),
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
        for name in ("model", "batch"):
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

    def _show_tensor_parallel(self, model: str, batch: int, rows: list[dict]) -> list[str]:
        """Draw `model`'s tensor-parallel runs at `batch` beside its one-GPU `rows`, or say how
        to record them; the status lines: the prefetch's gain at each GPU count."""
        runs = [(result, [r for r in result["rows"] if r["model"] == model
                          and r["batch"] == batch and r["variant"] != "hf-static"])
                for result in self.tensor_parallel]
        runs = [(result, tp_rows) for result, tp_rows in runs if tp_rows]
        height = FIGURE_HEIGHTS["tensor_parallel"]
        title = TITLES["tensor_parallel"].format(model=model, batch=batch)
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
        model, batch = self.controls["model"].value, self.controls["batch"].value
        rows = [r for r in self.recorded["rows"] if r["model"] == model]
        unreadable = [f"unreadable recording: {why}" for why in self.unreadable.values()]
        titles = {name: title.format(model=model, batch=batch) for name, title in TITLES.items()}
        if not rows and "recorded" in self.unreadable:
            for name, height in FIGURE_HEIGHTS.items():
                show_figure(self.figures[name], unreadable_figure(
                    titles[name], self.unreadable["recorded"], height))
            self.status.value = "<br>".join(map(html.escape, unreadable))
            return
        if not rows:
            for name, height in FIGURE_HEIGHTS.items():
                show_figure(self.figures[name], note_figure(
                    titles[name], "not recorded on the H200",
                    f"no recorded run of {html.escape(model)}: record one on a GPU with<br>"
                    + RECORD_COMMAND, height))
            self.status.value = "<br>".join([f"No end-to-end run of {html.escape(model)} recorded.",
                                             *map(html.escape, unreadable)])
            return
        provenance = label(self.recorded, rows)
        show_figure(self.figures["throughput"],
                    throughput_figure(rows, model, provenance, FIGURE_HEIGHTS["throughput"]))
        steps = {r["variant"]: r["step_ms_runs"] for r in rows if r["batch"] == batch}
        title, source, lines = titles["steps"], provenance, []
        if self.generated is not None and self.generated[:2] == (model, batch):
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
        best = min((r for r in rows if r["batch"] == batch and r["variant"] != "hf-static"),
                   key=lambda r: r["step_ms"])
        hf = next((r for r in rows if r["batch"] == batch and r["variant"] == "hf-static"), None)
        versus = (f", {hf['step_ms'] / best['step_ms']:.2f}x HF's static cache"
                  if hf is not None else "")
        gains = _prefetch_gains([r for r in rows if r["batch"] == batch])
        if gains:
            lines.append("The paper's prefetch at this batch: " + ", ".join(gains))
        lines += self._show_tensor_parallel(model, batch, rows)
        lines += self._serving_lines(model)
        lines += map(html.escape, unreadable)
        self.status.value = "<br>".join([
            f"{html.escape(model)} batch {batch} ({html.escape(provenance)}): fastest "
            f"{html.escape(best['variant'])} {best['step_ms']:.2f} ms a step, "
            f"{best['tokens_per_s']:,.0f} tokens/s, {best['ratio_to_roofline']:.2f}x the "
            f"roofline step{versus}", *lines])


def _prefetch_gains(rows: list[dict]) -> list[str]:
    """Each variant with the paper's prefetch against its kernel without it among `rows` (one
    batch of one run), as "<with> 0.98x <without>'s speed"."""
    step_ms = {r["variant"]: r["step_ms"] for r in rows}
    return [f"{html.escape(with_)} {step_ms[without] / step_ms[with_]:.2f}x "
            f"{html.escape(without)}'s speed" for with_, without in prefetch_pairs(step_ms)]
