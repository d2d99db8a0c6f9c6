"""One decode step of kvlab.LLM traced kernel by kernel: `python -m kvlab bench steptrace`.

For each model and batch, kvlab.LLM (seeded random weights, `gqa`, CUDA graphs, steps queued
ahead) generates --new-tokens tokens for prompts of --prompt tokens under torch.profiler with
CUDA activity. The prompts are prefilled in one pass, so that every step decodes the whole batch
(`engine_options`; a kept step that does not is an error). Each decode step is one CUDA graph
launch, and the kernels it ran carry that launch's correlation id (`split_steps`).
The last --steps steps are kept. Each step records:

- its span, from its first kernel's start to its last kernel's end;
- the kernels' busy time;
- the gaps between consecutive kernels (`step_summary`).

The last step is kept whole, kernel by kernel. Beside each trace go the step's bytes at the copy
roofline, measured in the same run, and the idle budget that kvlab.predict.step models for it.
The trace checks that model: HBM also idles inside a kernel (its ramp and tail), so the gaps are
a lower bound of the idle time.

With --ahead-bytes, each point is traced once per size given, on the same weights and prompts
(0: without the cross-kernel prefetch; kvlab.LLM's ahead_bytes), each with the step modelled at
that size. With --ahead-kv-bytes, once more per size of the K/V blocks' prefetch (kvlab.LLM's
ahead_kv_bytes), each with each --ahead-bytes; a size > 0 runs only at batches the QKV linear
serves (layer_ops.LINEAR_ROWS), the others named in `skipped`.

With --counters, Nsight Compute also profiles one decode step at each point and size
(kvlab.bench.stepcounters: every kernel's L2 load hits, one kernel after another, nothing flushed
between them). The row's `counters` keep every kernel's, and per GEMM of a layer (and the LM
head) the median share of its loaded bytes that hit L2 beside the share the prefetch brings by
kvlab.predict.step.ahead_hits: the L2 side of the cross-kernel prefetch, checked. Beside them,
the attention's (`gqa_decode`) median share over the layers, with the share of a layer's K and V
that ahead_kv_bytes covers.
"""

from __future__ import annotations

import itertools
import shutil
import statistics
import sys

from kvlab.arith import ceil_div
from kvlab.bench.env import gpu_info, run_info
from kvlab.config import MODELS

GRAPH_LAUNCH = "cudaGraphLaunch"  # the runtime call whose correlation id a graph's kernels carry
ATTENTION = "gqa_decode"  # the attention kernel's name in ncu's rows (not its merge, gqa_merge)


def split_steps(events: list[dict]) -> list[list[dict]]:
    """The kernels of each CUDA graph launch, in launch order, each step's kernels by start.

    events: dicts {"name", "kind": "runtime" or "kernel", "correlation", "start_us", "dur_us"}
    (`kineto_events`). Kernels launched outside a graph (the prefill, the sampling) are left
    out. Raises ValueError for an event without those keys."""
    launches, kernels = [], {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not {"name", "kind", "correlation", "start_us",
                                           "dur_us"} <= set(e):
            raise ValueError(f"events[{i}]={e!r:.80}: must be a dict with name, kind, "
                             "correlation, start_us and dur_us")
        if e["kind"] == "runtime" and e["name"] == GRAPH_LAUNCH:
            launches.append(e)
        elif e["kind"] == "kernel":
            kernels.setdefault(e["correlation"], []).append(e)
    launches.sort(key=lambda e: e["start_us"])
    return [sorted(kernels[e["correlation"]], key=lambda k: k["start_us"])
            for e in launches if e["correlation"] in kernels]


def step_summary(kernels: list[dict]) -> dict:
    """One step's kernels (`split_steps`): {"num_kernels", "span_us", "busy_us", "gap_us" (the
    idle time between consecutive kernels; overlapping kernels count no gap)}. Raises ValueError
    for a step without kernels."""
    if not kernels:
        raise ValueError("kernels=[]: a step needs at least one kernel")
    busy = sum(k["dur_us"] for k in kernels)
    gap, end = 0.0, kernels[0]["start_us"]
    for k in kernels:
        gap += max(0.0, k["start_us"] - end)
        end = max(end, k["start_us"] + k["dur_us"])
    return {"num_kernels": len(kernels), "span_us": end - kernels[0]["start_us"],
            "busy_us": busy, "gap_us": gap}


def kineto_events(prof) -> list[dict]:
    """torch.profiler's CUDA runtime calls and kernels as `split_steps` takes them."""
    from torch.autograd import DeviceType

    found = []
    for e in prof.profiler.kineto_results.events():
        kind = "kernel" if e.device_type() == DeviceType.CUDA else "runtime"
        found.append({"name": e.name(), "kind": kind, "correlation": e.correlation_id(),
                      "start_us": e.start_ns() / 1e3, "dur_us": e.duration_ns() / 1e3})
    return found


def _median_share(kernels: list[dict]) -> float | None:
    """The median of the kernels' shares of loaded bytes that hit L2 (None where none read)."""
    shares = [k["load_hit_share"] for k in kernels if k["load_hit_share"] is not None]
    return statistics.median(shares) if shares else None


def step_counters(model: str, batch: int, context: float, ahead_bytes: int,
                  kernels: list[dict], ahead_kv_bytes: int = 0) -> dict:
    """A step's ncu rows (kvlab.bench.stepcounters.step_rows) with its GEMMs set beside the step
    model's: {"kernels", "gemms": per GEMM name in step order {"name", "load_hit_share" (the
    median over the layers of the share of its loads' bytes that hit L2), "prefetched_share"
    (kvlab.predict.step.ahead_hits' bytes over the weight's, at `context` tokens)} or None where
    ncu's GEMMs are not the model's in number, "note", "attention": {"load_hit_share" (the
    median over the attention kernels, ATTENTION), "prefetched_share" (ahead_kv_bytes over a
    layer's K and V at `context` tokens, at most 1)}}."""
    from kvlab.predict.step import ahead_hits

    modelled = ahead_hits(model, batch, context, ahead_bytes)
    gemms = [k for k in kernels if k["is_gemm"]]
    layer_kv = MODELS[model].kv_bytes_per_token() / MODELS[model].num_layers * batch * context
    found = {"kernels": kernels, "gemms": None, "note": None, "attention": {
        "load_hit_share": _median_share([k for k in kernels if ATTENTION in k["kernel_name"]]),
        "prefetched_share": min(1.0, ahead_kv_bytes / layer_kv)}}
    if len(gemms) != len(modelled):
        found["note"] = (f"ncu gave {len(gemms)} GEMM kernels, the step model "
                         f"{len(modelled)}: not paired")
        return found
    by_name: dict[str, dict] = {}
    for (name, weight, prefetched), kernel in zip(modelled, gemms, strict=True):
        entry = by_name.setdefault(name, {"name": name, "kernels": [],
                                          "prefetched_share": prefetched / weight})
        entry["kernels"].append(kernel)
    found["gemms"] = [{"name": e["name"], "prefetched_share": e["prefetched_share"],
                       "load_hit_share": _median_share(e["kernels"])} for e in by_name.values()]
    return found


def _profiled(name: str, batch: int, ahead: int, ahead_kv: int, args) -> dict:
    """`step_counters` of one step profiled by ncu after a prompt of args.prompt tokens, or
    {"error": why ncu gave none} (the other points still run)."""
    from kvlab.bench.stepcounters import StepSpec, measure_step
    from kvlab.profile import CountersError

    try:
        rows = measure_step(StepSpec(name, batch, args.prompt, ahead, ahead_kv),
                            timeout_s=args.timeout)
    except CountersError as error:
        print(f"{_point(name, batch, ahead, ahead_kv)}: no counters: {error}", file=sys.stderr)
        return {"error": str(error)}
    return step_counters(name, batch, args.prompt + 2, ahead, rows, ahead_kv)  # (its 2nd step)


def _point(name: str, batch: int, ahead: int, ahead_kv: int) -> str:
    """A point as the progress lines and the report name it."""
    return (f"{name} batch={batch} ahead_bytes={ahead:,}"
            + (f" ahead_kv_bytes={ahead_kv:,}" if ahead_kv else ""))


def check(args) -> None:
    """Raise ValueError unless this machine can run the benchmark."""
    from kvlab.device import backend

    for name in args.models:
        if MODELS[name].family == "opt":
            raise ValueError(f"--models {name}: the step model (kvlab.predict.step) covers Llama "
                             "and Qwen2 models")
        if args.prompt + args.new_tokens > MODELS[name].max_position:
            raise ValueError(f"--prompt {args.prompt} + --new-tokens {args.new_tokens}: beyond "
                             f"{name}'s context limit of {MODELS[name].max_position}")
    if args.steps >= args.new_tokens:
        raise ValueError(f"--steps {args.steps}: must be fewer than --new-tokens "
                         f"{args.new_tokens} (the first steps warm up)")
    if args.counters and shutil.which("ncu") is None:
        raise ValueError("--counters needs Nsight Compute: ncu not found on PATH")
    if backend() != "cuda":
        raise ValueError("python -m kvlab bench steptrace needs a CUDA GPU usable through "
                         "torch and CuPy (kvlab.backend() is 'sim' here)")


def _trace(llm, prompts: list, new_tokens: int) -> tuple[list[list[dict]], list[int]]:
    """The kernels of each decode step of one generate call, traced, and how many sequences
    each step decoded (Generation.step_batch)."""
    import torch

    llm.generate(prompts, new_tokens, ignore_eos=True)  # capture the graphs untraced
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = llm.generate(prompts, new_tokens, ignore_eos=True)
    return split_steps(kineto_events(prof)), out.step_batch


def mean_context(prompt: int, new_tokens: int, steps: int) -> float:
    """The context the step model is asked at for a trace of the last `steps` decode steps of
    `new_tokens` after prompts of `prompt` tokens: the kept steps' mean."""
    return prompt + new_tokens - steps / 2


def engine_options(batch: int, prompt: int, new_tokens: int) -> dict:
    """kvlab.LLM's sizes for a trace of `batch` prompts of `prompt` tokens: blocks for them all,
    every prompt in one prefill pass (so that every step decodes the whole batch, none admitted
    later or finished sooner) and the graphs that `python -m kvlab bench e2e` times: the
    engine's own, longer where a sequence outgrows them (kvlab.bench.e2e.graph_max_len)."""
    from kvlab.bench.e2e import graph_max_len

    return {"num_blocks": batch * ceil_div(prompt + new_tokens, 16) + 16,
            "max_prefill_tokens": batch * prompt,
            "graph_max_len": graph_max_len(prompt, new_tokens)}


def run(args) -> dict:
    import torch

    import kvlab
    from kvlab.bench.e2e import free_memory, random_prompts
    from kvlab.engine.weights import ModelWeights
    from kvlab.kernels.layer_ops import LINEAR_ROWS
    from kvlab.predict.step import FOLDED_KEY, fit_step_model, step_anatomy
    from kvlab.timing import Timer, copy_roofline_gbps

    fit = fit_step_model()
    result = {"benchmark": "steptrace", **run_info(), **gpu_info(), "command": args.command,
              "dtype": "float16", "attention": "gqa",
              "timing": "torch.profiler's CUDA activity (CUPTI) of one generate call after an "
                        "untraced one; a step is one CUDA graph launch",
              "roofline_copy_gbps": round(copy_roofline_gbps(Timer("cuda")), 1),
              "step_model": {"streaming_overhead_us": fit.streaming_overhead_us,
                             "overhead_us": fit.overhead_us,
                             "per_sequence_us": fit.per_sequence_us}, "rows": [], "skipped": [],
              FOLDED_KEY: True}  # the step model's kernels of these steps
    for name in args.models:
        weights = ModelWeights.random(MODELS[name], 0, torch.float16, "cuda")
        for batch, ahead, ahead_kv in itertools.product(args.batches, args.ahead_bytes,
                                                        args.ahead_kv_bytes):
            if ahead_kv and batch > LINEAR_ROWS:
                result["skipped"].append({
                    "model": name, "batch": batch, "ahead_bytes": ahead,
                    "ahead_kv_bytes": ahead_kv, "reason": "the K/V blocks' prefetch runs in the "
                    f"QKV linear of layer_ops, at most {LINEAR_ROWS} rows"})
                continue
            print(_point(name, batch, ahead, ahead_kv), file=sys.stderr)
            llm = kvlab.LLM(name, attention="gqa", weights=weights, ahead_bytes=ahead,
                            ahead_kv_bytes=ahead_kv,
                            **engine_options(batch, args.prompt, args.new_tokens))
            steps, decoded = _trace(llm, random_prompts(MODELS[name], batch, args.prompt),
                                    args.new_tokens)
            kept = steps[-args.steps:]
            if not kept:
                raise RuntimeError(f"{name} batch={batch}: no decode step ran as a CUDA graph")
            if decoded[-len(kept):] != [batch] * len(kept):
                raise RuntimeError(f"{name} batch={batch}: the traced steps decoded "
                                   f"{decoded[-len(kept):]} sequences, not the whole batch")
            summaries = [step_summary(s) for s in kept]
            last, context = kept[-1], mean_context(args.prompt, args.new_tokens, args.steps)
            modelled = step_anatomy(name, batch, context, result["roofline_copy_gbps"], fit,
                                    ahead)
            result["rows"].append({
                "model": name, "batch": batch, "ahead_bytes": ahead, "ahead_kv_bytes": ahead_kv,
                "prompt": args.prompt,
                "new_tokens": args.new_tokens, "steps": summaries,
                **{key: statistics.median(s[key] for s in summaries)
                   for key in ("num_kernels", "span_us", "busy_us", "gap_us")},
                "roofline_us": modelled["roofline_us"], "modelled_idle_us": modelled["idle_us"],
                "modelled_step_us": modelled["step_us"],
                "kernels": [{"name": k["name"], "start_us": k["start_us"] - last[0]["start_us"],
                             "dur_us": k["dur_us"]} for k in last]})
            del llm
            free_memory()  # the profiled process makes caches of its own
            if args.counters:
                result["rows"][-1]["counters"] = _profiled(name, batch, ahead, ahead_kv, args)
        del weights  # before the next model's are made
        free_memory()
    return result


def share_text(value: float | None) -> str:
    """A share of loads that hit L2 as a report prints it: "17%", or "-" where ncu gave none."""
    return "-" if value is None else f"{value:.0%}"


def report(result: dict) -> str:
    lines = [f"{result.get('gpu', 'GPU')}: one decode step of kvlab.LLM (gqa, CUDA graphs), "
             f"traced; copy roofline {result['roofline_copy_gbps']:,.0f} GB/s",
             f"{'model':12} {'B':>4} {'ahead MB':>8} {'K/V MB':>7} {'kernels':>8} "
             f"{'span ms':>8} {'busy ms':>8} {'gaps ms':>8} {'roofline':>9} "
             f"{'modelled idle':>14}"]
    for r in result["rows"]:
        lines.append(f"{r['model']:12} {r['batch']:>4} {r.get('ahead_bytes', 0) / 1e6:>8.1f} "
                     f"{r.get('ahead_kv_bytes', 0) / 1e6:>7.1f} {r['num_kernels']:>8.0f} "
                     f"{r['span_us'] / 1e3:>8.3f} {r['busy_us'] / 1e3:>8.3f} "
                     f"{r['gap_us'] / 1e3:>8.3f} {r['roofline_us'] / 1e3:>9.3f} "
                     f"{r['modelled_idle_us'] / 1e3:>14.3f}")
    for r in result["rows"]:
        counters = r.get("counters")
        if counters is None:
            continue
        head = _point(r["model"], r["batch"], r.get("ahead_bytes", 0), r.get("ahead_kv_bytes", 0))
        attention = counters.get("attention")
        if attention is not None:
            lines.append(f"{head}: attention loads hitting L2, ncu "
                         f"{share_text(attention['load_hit_share'])} (the K/V prefetch's share "
                         f"{share_text(attention['prefetched_share'])})")
        if counters.get("gemms") is None:
            lines.append(f"{head}: {counters.get('note') or counters.get('error')}")
            continue
        shares = ", ".join(f"{g['name']} {share_text(g['load_hit_share'])} "
                           f"({share_text(g['prefetched_share'])})" for g in counters["gemms"])
        lines.append(f"{head}: GEMM loads hitting L2, ncu (the prefetch's share, modelled): "
                     f"{shares}")
    for skip in result.get("skipped", []):
        point = _point(skip["model"], skip["batch"], skip["ahead_bytes"], skip["ahead_kv_bytes"])
        lines.append(f"{point} skipped: {skip['reason']}")
    return "\n".join(lines)
