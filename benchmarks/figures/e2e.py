"""Whole-model decode steps and serving runs (results/h200/e2e*.json), and one step traced
kernel by kernel on an H100 (results/h100/steptrace*.json).
"""

from __future__ import annotations

import functools

from kvlab.bench.e2e import prefetch_pairs
from kvlab.predict.ahead import (
    AHEAD_RECORDED,
    KV_COUNTERS,
    KV_LEVER,
    KV_RECORDED,
    KV_RUNS,
    LEVER_RUNS,
    MIN_PREFETCHED_SHARE,
    counter_pairs,
    kv_delivery,
    kv_pairs,
    lever_pairs,
)
from kvlab.results import E2E, load_result, load_results, results_dir

from .common import pct_range, source, value_range

# The recorded end-to-end runs of 256 new tokens (`load_results("h200", E2E_RESULTS)`).
E2E_RESULTS = E2E[1]
# One step traced at prompts of 512, 4,064 and 32,736 tokens; ncu's counters of a step's kernels
TRACES = ("steptrace", "steptrace_4k", "steptrace_32k")
TRACED_GPU = "h100-sxm"  # the kvlab.gpus key of the GPU that traced them


def e2e_table(result: dict) -> list[str]:
    """Decode steps of whole models (results/h200/e2e*.json), per model and batch: each
    variant's ms per step (tokens/s), HF's static cache, the roofline step, and the fastest
    variant over HF and over the roofline; then, per model, the speed of each variant with the
    paper's prefetch over the same variant without it at each batch."""
    rows = result["rows"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = ["| model | batch | " + " | ".join(variants) + " | roofline | fastest kvlab / HF | "
             "fastest kvlab / roofline |", "|---|---|" + "---|" * (len(variants) + 3)]
    for model, batch in dict.fromkeys((r["model"], r["batch"]) for r in rows):
        mine = {r["variant"]: r for r in rows if (r["model"], r["batch"]) == (model, batch)}
        cells = [f"{mine[v]['step_ms']:.2f} ms ({mine[v]['tokens_per_s']:,.0f})" for v in variants]
        best = min((r for v, r in mine.items() if v != "hf-static"), key=lambda r: r["step_ms"])
        roofline = best["roofline_ms"]
        lines.append(f"| {model} | {batch} | " + " | ".join(cells) + f" | {roofline:.2f} ms | "
                     f"{mine['hf-static']['step_ms'] / best['step_ms']:.2f}x | "
                     f"{best['step_ms'] / roofline:.2f}x |")
    for model in dict.fromkeys(r["model"] for r in rows):
        ms = {(r["variant"], r["batch"]): r["step_ms"] for r in rows if r["model"] == model}
        batches = sorted({b for _, b in ms})
        gains = [f"{with_} over {without} " + ", ".join(
            f"{ms[without, b] / ms[with_, b]:.2f}x" for b in batches)
            for with_, without in prefetch_pairs(variants)]
        lines.append(f"- {model}, batch {', '.join(map(str, batches))}: " + "; ".join(gains)
                     + ".")
    return lines


def serving_table(result: dict) -> list[str]:
    """The serving runs of a bench e2e result (`--serve-rates`, results/h200/e2e_serving.json):
    per model, variant and arrival rate, output tokens/s, time to first token and time per output
    token (p50, p99), and preemptions."""
    lines = ["| model | variant | requests | rate | output tokens/s | TTFT p50 / p99 | "
             "TPOT p50 / p99 | preemptions |", "|---|---|---|---|---|---|---|---|"]
    for r in result["serving"]:
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['requests']} | {r['rate']:g}/s | "
            f"{r['output_tokens_per_s']:,.0f} | {r['ttft_ms_p50']:,.1f} / {r['ttft_ms_p99']:,.1f} "
            f"ms | {r['tpot_ms_p50']:.2f} / {r['tpot_ms_p99']:.2f} ms | {r['preemptions']} |")
    return lines


# The batch at which the README and the targets compare kvlab with HF.
TARGET_BATCH = 64
STEP_TARGETS = {1: 1.08, 64: 1.20}  # issue 52's: a step over its roofline step, at most


def steps() -> dict:
    """(model, batch) -> {variant: row} over E2E_RESULTS."""
    found = {}
    for r in load_results("h200", E2E_RESULTS)["rows"]:
        found.setdefault((r["model"], r["batch"]), {})[r["variant"]] = r
    return found


def fastest(variants: dict) -> dict:
    """The fastest kvlab variant's row of one (model, batch)."""
    return min((r for v, r in variants.items() if v != "hf-static"), key=lambda r: r["step_ms"])


def summary() -> list[str]:
    """The fastest variant against HF's static cache and the roofline step, and the prefetch's
    effect, one bullet each."""
    found = steps()
    at = {m: v for (m, b), v in found.items() if b == TARGET_BATCH}
    over_hf = ", ".join(f"{m} {v['hf-static']['step_ms'] / fastest(v)['step_ms']:.2f}x"
                        for m, v in at.items())
    hf_ms = ", ".join(f"{m} {v['hf-static']['step_ms']:.2f} ms" for m, v in at.items())

    def roofline(keep):
        return value_range([fastest(v)["step_ms"] / fastest(v)["roofline_ms"]
                       for (_, b), v in found.items() if keep(b)])

    gains = {(m, b, w): v[wo]["step_ms"] / v[w]["step_ms"]
             for (m, b), v in found.items() for w, wo in prefetch_pairs(list(v))}
    above = [f"{m} batch {b} ({w}, {g:.3f}x)" for (m, b, w), g in gains.items() if g > 1.01]
    return [
        f"- **Against HF's static cache** at batch {TARGET_BATCH}, the fastest variant runs "
        f"{over_hf} as fast. HF's own step there: {hf_ms}.",
        f"- **Against the roofline step**: {roofline(lambda b: b == 1)} at batch 1, "
        f"{roofline(lambda b: b > 1)} at batch 16 to 128.",
        f"- **The paper's prefetch** moves a step by {value_range(list(gains.values()))} over the "
        "same variant without it; above 1.01x at " + (", ".join(above) or "no point") + "."]


def hf_first_steps() -> str:
    """Over the models, the range of the longest first decode step HF took at any of its
    points, in seconds: the step in which its static-cache decode is compiled."""
    first = {}
    for (model, _), v in steps().items():
        first[model] = max(first.get(model, 0), v["hf-static"]["step_ms_runs"][0] / 1000)
    return f"{min(first.values()):.1f}-{max(first.values()):.1f} s"


def serving_summary() -> str:
    """Per arrival rate: the output tokens/s asked (the requests' mean output times the rate)
    against those served."""
    runs = load_result("h200", "e2e_serving")["serving"]
    return "; ".join(
        f"at {r['rate']:g} requests/s about {r['output_tokens'] / r['requests'] * r['rate']:,.0f} "
        f"output tokens/s are asked and {r['output_tokens_per_s']:,.0f} served" for r in runs)


@functools.cache
def _step_model():
    """kvlab.predict.step's fit to the recorded steps, made once a docgen pass."""
    from kvlab.predict.step import fit_step_model

    return fit_step_model()


def step_model_constants() -> str:
    """The step model's three constants and its held-out error (kvlab.predict.step)."""
    fit = _step_model()
    return (f"{fit.streaming_overhead_us:.2f} us of idle HBM a modelled kernel at batch 1 and 2, "
            f"{fit.overhead_us:.2f} us at larger batches, and {fit.per_sequence_us:.3f} us a "
            f"sequence and layer, fitted on {fit.points} steps; on each model left out of the "
            f"fit in turn its step is within {fit.held_out_error:.1%} (median "
            f"{fit.median_error:.1%})")


def step_model_table() -> list[str]:
    """Per model and batch of gqa's recorded steps: the step over the roofline step, the
    modelled idle budget, and the step less that budget over the roofline step."""
    from kvlab.predict.step import recorded_folded, step_anatomy

    fit = _step_model()
    lines = ["| model | batch | step / roofline step | idle budget (modelled) | step less the "
             "budget / roofline step |", "|---|---|---|---|---|"]
    for name in E2E_RESULTS:
        result = load_result("h200", name)
        for r in result["rows"]:
            if r["variant"] != "gqa":
                continue
            anatomy = step_anatomy(r["model"], r["batch"], r["prompt"] + r["new_tokens"] / 2,
                                   result["roofline_copy_gbps"], fit,
                                   folded=recorded_folded(result))
            idle_ms = anatomy["idle_us"] / 1e3
            lines.append(f"| {r['model']} | {r['batch']} | {r['ratio_to_roofline']:.2f}x | "
                         f"{idle_ms:.2f} ms ({idle_ms / r['step_ms']:.0%} of the step) | "
                         f"{(r['step_ms'] - idle_ms) / r['roofline_ms']:.2f}x |")
    return lines


@functools.cache
def _ahead_bounds() -> tuple[dict, ...]:
    """Per model and batch of gqa's recorded steps: the cross-kernel prefetch's default size
    (kvlab.predict.step.ahead_size at the run's roofline), the recorded step over the roofline
    step, and that step less the idle time the prefetch hides in the step model (a bound)."""
    from kvlab.predict.step import ahead_size, recorded_folded, step_anatomy

    fit, found = _step_model(), []
    for name in E2E_RESULTS:
        result = load_result("h200", name)
        gbps = result["roofline_copy_gbps"]
        for r in result["rows"]:
            if r["variant"] != "gqa":
                continue
            size = ahead_size(fit, gbps, r["batch"])
            context = r["prompt"] + r["new_tokens"] / 2
            hidden_ms = step_anatomy(r["model"], r["batch"], context, gbps, fit, size,
                                     folded=recorded_folded(result))["hidden_us"] / 1e3
            found.append({"model": r["model"], "batch": r["batch"], "size": size,
                          "ratio": r["ratio_to_roofline"],
                          "bound": (r["step_ms"] - hidden_ms) / r["roofline_ms"]})
    return tuple(found)


def ahead_bound_table() -> list[str]:
    """`_ahead_bounds` as a table."""
    return ["| model | batch | ahead_bytes | step / roofline step | with the prefetch, "
            "modelled bound |", "|---|---|---|---|---|"] + [
        f"| {b['model']} | {b['batch']} | {b['size'] / 2**20:.1f} MiB | {b['ratio']:.2f}x | "
        f"{b['bound']:.2f}x |" for b in _ahead_bounds()]


def ahead_bound_summary() -> str:
    """How many models' batch-1 and batch-64 bounds meet issue 52's targets (1.08x and
    1.20x the roofline step)."""
    met = {batch: [b["bound"] <= target for b in _ahead_bounds() if b["batch"] == batch]
           for batch, target in STEP_TARGETS.items()}
    return (f"the bound meets the batch-1 target on {sum(met[1])} of {len(met[1])} models and "
            f"the batch-64 target on {sum(met[64])} of {len(met[64])}")


@functools.cache
def _ahead_pairs() -> tuple[tuple[dict, dict, float, str, str], ...]:
    """(gqa's row, gqa+ahead's row, its run's copy roofline in GB/s, the GPU's kvlab.gpus key,
    the recording "machine/name") at each point of the cross-kernel prefetch runs
    (LEVER_RUNS)."""
    pairs = []
    for gpu, machine, name in LEVER_RUNS:
        result = load_result(machine, name)
        pairs += [(gqa, ahead, result["roofline_copy_gbps"], gpu, f"{machine}/{name}")
                  for gqa, ahead in lever_pairs(result)]
    return tuple(pairs)


def ahead_measured_table() -> list[str]:
    """Per recording, prompt, model and batch: gqa's step, gqa+ahead's, the speed-up and the
    tokens' check."""
    lines = ["| recording | prompt | model | batch | ahead_bytes | gqa ms a step | gqa+ahead | "
             "speed-up | step / roofline step (with) | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for gqa, ahead, _, _, run in _ahead_pairs():
        lines.append(_lever_row(run, gqa, ahead, "ahead_bytes",
                                f"{gqa['ratio_to_roofline']:.2f}x "
                                f"({ahead['ratio_to_roofline']:.2f}x)"))
    return lines


def _lever_row(first: str, gqa: dict, on: dict, size: str, *between: str) -> str:
    """A table row of a lever's point: `first`, the prompt, model and batch, the lever's size
    (`on[size]`, MiB), gqa's step and the lever's, the speed-up, the cells `between`, and
    whether the greedy tokens were the same."""
    cells = [first, f"{gqa['prompt']:,}", gqa["model"], str(gqa["batch"]),
             f"{on[size] / 2**20:.1f} MiB", f"{gqa['step_ms']:.2f}", f"{on['step_ms']:.2f}",
             f"{gqa['step_ms'] / on['step_ms']:.3f}x", *between,
             "yes" if on["same_tokens"] else "no"]
    return f"| {' | '.join(cells)} |"


def ahead_measured_summary() -> str:
    """The speed-up's range at batch 1 and above it, per GPU and prompt length."""
    def span(gpu, prompt, keep):
        speeds = [g["step_ms"] / a["step_ms"] for g, a, _, on, _ in _ahead_pairs()
                  if on == gpu and g["prompt"] == prompt and keep(g["batch"])]
        return value_range(speeds, "{:.3f}") if speeds else None

    parts = []
    for gpu, prompt in dict.fromkeys((on, g["prompt"]) for g, _, _, on, _ in _ahead_pairs()):
        one, more = span(gpu, prompt, lambda b: b == 1), span(gpu, prompt, lambda b: b > 1)
        said = (f"{one} gqa's speed at batch 1" + (f" and {more} above it" if more else "")
                if one else f"{more} gqa's speed above batch 1")
        parts.append(f"on the {gpu} with {prompt:,}-token prompts, {said}")
    return "; ".join(parts)


def ahead_targets() -> str:
    """Per GPU and prompt length of the lever's runs: gqa's step over its roofline step at
    batch 1 and at batch 64 (issue 52's targets: at most 1.08x and 1.20x)."""
    parts = []
    for gpu, prompt in dict.fromkeys((on, g["prompt"]) for g, _, _, on, _ in _ahead_pairs()):
        ratios = {b: [g["ratio_to_roofline"] for g, _, _, on, _ in _ahead_pairs()
                      if (on, g["prompt"], g["batch"]) == (gpu, prompt, b)] for b in (1, 64)}
        said = [f"{value_range(ratios[b])} at batch {b}" for b in (1, 64) if ratios[b]]
        if said:
            parts.append(f"on the {gpu} with {prompt:,}-token prompts, {' and '.join(said)}")
    return "; ".join(parts)


def recorded_traces(machine: str) -> tuple[str, ...]:
    """The TRACES that `machine` has recorded."""
    return tuple(name for name in TRACES if (results_dir() / machine / f"{name}.json").exists())


def _traced(machine: str = "h100", names=TRACES) -> list[tuple[dict, dict]]:
    """(row, its kernel groups: kvlab.viz.e2e.trace_groups with the step model's bytes) of
    every traced step without the cross-kernel prefetch of `machine`'s recordings `names`, in
    the order recorded."""
    from kvlab.bench.steptrace import mean_context
    from kvlab.predict.step import recorded_folded, step_anatomy
    from kvlab.viz.e2e import trace_groups

    found = []
    for name in names:
        result = load_result(machine, name)
        for row in result["rows"]:
            if row["ahead_bytes"]:
                continue
            context = mean_context(row["prompt"], row["new_tokens"], len(row["steps"]))
            anatomy = step_anatomy(row["model"], row["batch"], context,
                                   result["roofline_copy_gbps"], _step_model(),
                                   folded=recorded_folded(result))
            groups = {g["group"]: g for g in trace_groups(row["kernels"], anatomy)}
            found.append((row, groups))
    return found


def _beyond(groups: dict, gemms: bool) -> float:
    """The time (us) the GEMMs (or every other kernel) of a traced step take beyond their bytes
    at the copy roofline (a group the step model has no bytes of: all its time)."""
    return sum(g["busy_us"] - (g["roofline_us"] or 0.0) for name, g in groups.items()
               if (name == "GEMMs") == gemms)


def _covered_us(kernels: list[dict]) -> float:
    """The time (us) in which at least one of `kernels` (in start order) runs: kernels that
    overlap (the attention's merge, launched early) count once."""
    from kvlab.bench.steptrace import step_summary

    summary = step_summary(kernels)
    return summary["span_us"] - summary["gap_us"]


def steptrace_table(machine: str = "h100", names=TRACES) -> list[str]:
    """Per traced step (`_traced`'s): its time over its bytes at the copy roofline, and the time
    beyond it split: the gaps between kernels, the GEMMs' time beyond their bytes, the other
    kernels'; the GEMMs' time and the attention's (its kernels' covered time) over their
    bytes'."""
    lines = ["| model | prompt | batch | kernels | step ms | / roofline step | beyond it: gaps "
             "| GEMMs beyond their bytes | other kernels beyond theirs | GEMMs' time / their "
             "bytes | attention's |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, groups in _traced(machine, names):
        gemms, attention = groups["GEMMs"], groups["attention"]
        lines.append(f"| {row['model']} | {row['prompt']:,} | {row['batch']} | "
                     f"{row['num_kernels']:.0f} | {row['span_us'] / 1e3:.2f} | "
                     f"{row['span_us'] / row['roofline_us']:.2f}x | "
                     f"{row['gap_us'] / 1e3:.2f} ms | {_beyond(groups, True) / 1e3:.2f} ms | "
                     f"{_beyond(groups, False) / 1e3:.2f} ms | "
                     f"{gemms['busy_us'] / gemms['roofline_us']:.2f}x | "
                     f"{_covered_us(attention['kernels']) / attention['roofline_us']:.2f}x |")
    return lines


def window_bound() -> str:
    """Per GPU of the lever's runs: the most that an access-policy window keeping data in L2
    from one step to the next could win at batch 1. It serves at most L2's bytes from L2
    instead of HBM: L2 at the run's copy roofline, over gqa's step."""
    from kvlab.gpus import GPUS

    parts = []
    for gpu in dict.fromkeys(on for _, _, _, on, _ in _ahead_pairs()):
        l2 = GPUS[gpu].l2_bytes
        points = [(l2 / gbps / 1e3, g["step_ms"]) for g, _, gbps, on, _ in _ahead_pairs()
                  if on == gpu and g["batch"] == 1]
        parts.append(f"on the {GPUS[gpu].name}, L2's {l2 / 2**20:.0f} MiB take "
                     f"{value_range([us for us, _ in points], '{:.0f}', ' µs')} at the copy "
                     f"roofline, {pct_range([us / 10 / ms for us, ms in points])} of a "
                     f"batch-1 step")
    return "; ".join(parts)


def kv_prefetch_room() -> str:
    """At batch 1 where a layer's K/V fit in the traced GPU's L2: the attention's covered time
    beyond its bytes at the copy roofline, as a share of the step (the most a prefetch of the
    K/V across kernel boundaries could win)."""
    from kvlab.config import MODELS
    from kvlab.gpus import GPUS

    shares = []
    for row, groups in _traced():
        m = MODELS[row["model"]]
        kv_bytes = 2 * 2 * row["prompt"] * m.kv_size  # a layer's K and V, fp16, batch 1
        if row["batch"] == 1 and kv_bytes <= GPUS[TRACED_GPU].l2_bytes:
            attention = groups["attention"]
            shares.append(100 * (_covered_us(attention["kernels"]) - attention["roofline_us"])
                          / row["span_us"])
    return value_range(shares, "{:.1f}", "%")


def steptrace_summary() -> str:
    """At batch 1 and at batches 16 and up: the share of a step's time beyond its roofline step
    in the gaps, the GEMMs and the other kernels; and the step over its roofline step at batch 1
    and 64."""
    traced = _traced()

    def shares(keep) -> str:
        parts = [(r["gap_us"], _beyond(g, True), _beyond(g, False)) for r, g in traced
                 if keep(r["batch"])]
        return ", ".join(
            f"{what} {value_range([100 * p[i] / sum(p) for p in parts], '{:.0f}', '%')}"
            for i, what in enumerate(("gaps", "GEMMs", "other kernels")))

    at = {b: [r["span_us"] / r["roofline_us"] for r, _ in traced if r["batch"] == b]
          for b in (1, 64)}
    return (f"of the time a step spends beyond its bytes at the copy roofline, at batch 1: "
            f"{shares(lambda b: b == 1)}; at batches 16 to 128: {shares(lambda b: b >= 16)}. A "
            f"step is {value_range(at[1])} its roofline step at batch 1 and "
            f"{value_range(at[64])} at batch 64")


@functools.cache
def _target_cuts() -> tuple[dict, ...]:
    """Per traced batch-1 step of either GPU: what it must lose to reach STEP_TARGETS[1] times
    its roofline step, and where its time beyond its bytes at the copy roofline lies, each a
    layer (us): {"gpu", "row", "cut", "attention" (its kernels' covered time), "small" (the
    norms and RoPE with the cache write), "gemms", "gaps"}."""
    from kvlab.config import MODELS

    found = []
    for machine in ("h100", "h200"):
        for row, groups in _traced(machine, recorded_traces(machine)):
            if row["batch"] != 1:
                continue
            layers = MODELS[row["model"]].num_layers
            attention = groups["attention"]
            small = sum(groups[g]["busy_us"] - groups[g]["roofline_us"]
                        for g in ("norms", "rope + cache write"))
            found.append({
                "gpu": machine, "row": row,
                "cut": (row["span_us"] - STEP_TARGETS[1] * row["roofline_us"]) / layers,
                "attention": (_covered_us(attention["kernels"]) - attention["roofline_us"])
                / layers,
                "small": small / layers,
                "gemms": _beyond(groups, True) / layers, "gaps": row["gap_us"] / layers})
    return tuple(found)


def target_cut_table() -> list[str]:
    """`_target_cuts` as a table."""
    return ["| GPU | model | prompt | step / roofline step | to lose a layer for "
            f"{STEP_TARGETS[1]:.2f}x | beyond their bytes, a layer: attention | "
            "norms and RoPE | GEMMs | gaps |",
            "|---|---|---|---|---|---|---|---|---|"] + [
        f"| {c['gpu'].upper()} | {c['row']['model']} | {c['row']['prompt']:,} | "
        f"{c['row']['span_us'] / c['row']['roofline_us']:.2f}x | {c['cut']:.1f} us | "
        f"{c['attention']:.1f} us | {c['small']:.1f} us | {c['gemms']:.1f} us | "
        f"{c['gaps']:.1f} us |" for c in _target_cuts()]


def target_cut_summary() -> str:
    """Per GPU: the range of the cut a layer, and at how many steps the norms and RoPE, or the
    attention, taking no time beyond their bytes would cover it alone, and the two together."""
    parts = []
    for gpu in ("h100", "h200"):
        cuts = [c for c in _target_cuts() if c["gpu"] == gpu]
        if not cuts:
            continue
        covered = {what: sum(sum(c[k] for k in keys) >= c["cut"] for c in cuts) for what, keys in
                   (("small", ("small",)), ("attention", ("attention",)),
                    ("both", ("small", "attention")))}
        parts.append(f"on the {gpu.upper()} a batch-1 step must lose "
                     f"{value_range([c['cut'] for c in cuts], '{:.1f}', ' us')} a layer; the "
                     f"norms and RoPE taking no time beyond their bytes would cover that at "
                     f"{covered['small']} of {len(cuts)} steps, the attention at "
                     f"{covered['attention']}, the two together at {covered['both']}")
    return "; ".join(parts)


LINEARS = ("qkv", "w_o", "gate + up", "down", "lm head")  # the step's GEMMs, by their step_kernels
# name; a trace's GEMM kernels are theirs in step order, a split-K reduce its GEMM's
SPLIT_K_REDUCE = "splitkreduce"
# the traces the GEMM table reads: per GPU, the one context (a GEMM reads no K/V, so the other
# contexts repeat its GEMMs)
GEMM_TRACES = {"h100": ("steptrace",), "h200": ("steptrace_4k",)}


def linear_times(row: dict, folded: bool) -> dict[str, tuple[float, float]]:
    """{linear of LINEARS: (its kernels' time in one traced step, us; their bytes, the step
    model's)} of a traced step (`bench steptrace`'s row), its GEMM kernels (TRACE_GROUPS') given
    to the step's linears in step order, a split-K reduce kernel to the GEMM before it. Raises
    ValueError where the trace's GEMMs are not the step's."""
    from kvlab.bench.steptrace import mean_context
    from kvlab.predict.step import step_kernels
    from kvlab.viz.e2e import TRACE_GROUPS

    keys = TRACE_GROUPS[0][1]
    context = mean_context(row["prompt"], row["new_tokens"], len(row["steps"]))
    linears = [(name, nbytes) for name, nbytes in
               step_kernels(row["model"], row["batch"], context, folded) if name in LINEARS]
    traced = [k for k in row["kernels"] if any(key in k["name"].lower() for key in keys)]
    gemms = sum(SPLIT_K_REDUCE not in k["name"].lower() for k in traced)
    where = f"{row['model']} batch {row['batch']}"
    if gemms != len(linears):
        raise ValueError(f"{where}: {gemms} GEMM kernels traced, the step has {len(linears)} "
                         "linears")
    if SPLIT_K_REDUCE in traced[0]["name"].lower():
        raise ValueError(f"{where}: a split-K reduce traced before any GEMM")
    found = {name: [0.0, 0.0] for name in LINEARS}
    done = 0
    for kernel in traced:
        if SPLIT_K_REDUCE not in kernel["name"].lower():
            found[linears[done][0]][1] += linears[done][1]
            done += 1
        found[linears[done - 1][0]][0] += kernel["dur_us"]
    return {name: (us, nbytes) for name, (us, nbytes) in found.items()}


@functools.cache
def _linear_shares() -> tuple[dict, ...]:
    """Per traced step without the prefetch of GEMM_TRACES: {"gpu", "row", "ratio": {linear:
    its time over its bytes at the copy roofline}, "beyond": {layer linear (GEMMS): that time
    beyond its bytes, us a layer}, "reduce": cuBLAS's split-K reduce kernels, us a layer}."""
    from kvlab.config import MODELS
    from kvlab.predict.step import GEMMS, recorded_folded

    found = []
    for machine, names in GEMM_TRACES.items():
        for name in names:
            result = load_result(machine, name)
            gbps, folded = result["roofline_copy_gbps"], recorded_folded(result)
            for row in result["rows"]:
                if row["ahead_bytes"] or row.get("ahead_kv_bytes"):
                    continue
                layers = MODELS[row["model"]].num_layers
                times = linear_times(row, folded)
                at_roofline = {k: nbytes / gbps * 1e-3 for k, (_, nbytes) in times.items()}
                reduce_us = sum(k["dur_us"] for k in row["kernels"]
                                if SPLIT_K_REDUCE in k["name"].lower())
                found.append({
                    "gpu": machine, "row": row,
                    "ratio": {k: us / at_roofline[k] for k, (us, _) in times.items()},
                    "beyond": {k: (times[k][0] - at_roofline[k]) / layers for k in GEMMS},
                    "reduce": reduce_us / layers})
    return tuple(found)


def linear_table() -> list[str]:
    """`_linear_shares` as a table: each linear's time over its bytes, and the reduce kernels."""
    return ["| GPU | model | prompt | batch | QKV | W_O | gate + up | down | LM head | "
            "split-K reduce, a layer |", "|---|---|---|---|---|---|---|---|---|---|"] + [
        f"| {s['gpu'].upper()} | {s['row']['model']} | {s['row']['prompt']:,} | "
        f"{s['row']['batch']} | " + " | ".join(f"{s['ratio'][k]:.2f}x" for k in LINEARS)
        + f" | {s['reduce']:.1f} us |" for s in _linear_shares()]


def linear_summary() -> str:
    """Per kind of GEMM kernel (kvlab's streaming linear at batches up to STREAMING_ROWS,
    cuBLAS's above): the range of each layer GEMM's time over its bytes, and the share of the
    layer GEMMs' time beyond their bytes that QKV and W_O hold."""
    from kvlab.predict.step import GEMMS, STREAMING_ROWS

    labels = {"qkv": "QKV", "w_o": "W_O", "gate + up": "gate and up", "down": "down"}
    parts = []
    for kind, keep in (("kvlab's streaming linear", lambda b: b <= STREAMING_ROWS),
                       ("cuBLAS", lambda b: b > STREAMING_ROWS)):
        shares = [s for s in _linear_shares() if keep(s["row"]["batch"])]
        if not shares:
            continue
        batches = sorted({s["row"]["batch"] for s in shares})
        ratios = ", ".join(f"{labels[k]} {value_range([s['ratio'][k] for s in shares], unit='x')}"
                           for k in GEMMS)
        beyond = [{k: max(s["beyond"][k], 0.0) for k in GEMMS} for s in shares]  # (a GEMM
        # under its bytes' time, the copy rate counting writes too, holds none)
        small = [100 * (b["qkv"] + b["w_o"]) / sum(b.values()) for b in beyond]
        parts.append(f"{kind} (batch {value_range(batches, '{:d}', '')}) took {ratios} of its "
                     f"bytes' time; QKV and W_O held {pct_range(small)} of the layer GEMMs' "
                     "time beyond their bytes")
    return "; ".join(parts)


# the step counters of the cross-kernel prefetch (bench steptrace --ahead-bytes 0 N --counters)
COUNTERS = AHEAD_RECORDED["h100-sxm"]["counters"]


def _counter_pairs() -> list[tuple[dict, dict]]:
    """(the row without the cross-kernel prefetch, one with it) at each point of the step
    counters, recording by recording (`counter_pairs`)."""
    machine, names = COUNTERS
    return [pair for name in names for pair in counter_pairs(load_result(machine, name))]


def _gemm_gains() -> list[tuple[dict, dict, float]]:
    """(the row with the prefetch, one GEMM of it, that GEMM's share of loads hitting L2 without
    the prefetch) for every GEMM at each point of the step counters."""
    found = []
    for before, after in _counter_pairs():
        shares = {g["name"]: g["load_hit_share"] for g in before["counters"]["gemms"]}
        found += [(after, g, shares[g["name"]]) for g in after["counters"]["gemms"]]
    return found


def step_counters_table() -> list[str]:
    """Per point and GEMM: ncu's share of its loaded bytes that hit L2, without and with the
    prefetch, the gain against the share the step model gives the prefetch."""
    lines = ["| model | prompt | batch | ahead_bytes | GEMM | L2 hits without | with | gain | "
             "modelled share | gain / modelled |", "|---|---|---|---|---|---|---|---|---|---|"]
    for after, g, before in _gemm_gains():
        gain = g["load_hit_share"] - before
        ratio = (f"{gain / g['prefetched_share']:.2f}"
                 if g["prefetched_share"] >= MIN_PREFETCHED_SHARE else "-")
        lines.append(f"| {after['model']} | {after['prompt']:,} | {after['batch']} | "
                     f"{after['ahead_bytes'] / 2**20:.0f} MiB | {g['name']} | {before:.1%} | "
                     f"{g['load_hit_share']:.1%} | {gain:+.1%} | {g['prefetched_share']:.1%} | "
                     f"{ratio} |")
    return lines


def _group_change(before: dict, after: dict) -> dict[str, float]:
    """Per kernel group, its time with the prefetch (`after`, a row of the step counters) less
    without (`before`), us."""
    from kvlab.viz.e2e import trace_groups

    busy = [{g["group"]: g["busy_us"] for g in trace_groups(r["kernels"])}
            for r in (before, after)]
    return {g: busy[1][g] - busy[0][g] for g in busy[0]}


def _hit_ratios() -> list[float]:
    """At batches 1 and 2, per GEMM: the rise of its L2 hits with the prefetch over the share
    the step model gives the prefetch (where that is MIN_PREFETCHED_SHARE or more)."""
    return [(g["load_hit_share"] - before) / g["prefetched_share"]
            for after, g, before in _gemm_gains()
            if after["batch"] <= 2 and g["prefetched_share"] >= MIN_PREFETCHED_SHARE]


def step_counters_summary() -> str:
    """What the prefetch brought into L2 against the model (`_hit_ratios`), and where the time
    went at each point above batch 2."""
    parts = [f"at batch 1 the GEMMs' L2 hits rose by {value_range(_hit_ratios(), unit='')} of "
             "the share the step model gives the prefetch"]
    for before, after in _counter_pairs():
        if before["batch"] > 2:
            change = _group_change(before, after)
            parts.append(f"at batch {before['batch']} and {before['prompt']:,} tokens "
                         f"({before['model']}) the GEMMs took {-change['GEMMs']:.0f} us less a "
                         f"step, while the norms took {change['norms']:+.0f} us and the "
                         f"element-wise kernels {change['element-wise']:+.0f} us")
    return "; ".join(parts)


@functools.cache
def _learned(gpu: str):
    """The cross-kernel prefetch learned from `gpu`'s recordings (kvlab.predict.ahead), on the
    step model."""
    from kvlab.predict.ahead import fit_ahead

    return fit_ahead(gpu, step=_step_model())


def ahead_learned_constants() -> list[str]:
    """Per GPU: the learned delivery and issue costs, the recordings, the points and the
    held-out check."""
    lines = []
    for gpu in AHEAD_RECORDED:
        fit = _learned(gpu)
        delivery = ", ".join(f"{regime} {share:.2f}" for regime, share in fit.delivery.items())
        cost = ", ".join(f"{key} {share:.2f}" for key, share in fit.issue_cost.items())
        lines.append(f"- {gpu} ({fit.sources}): delivery {delivery} (from {fit.gemms} GEMMs' "
                     f"counters); issue cost {cost} (from {fit.steps} steps); on models left "
                     f"out, within {fit.held_out_us:.0f} us of the recorded change of a step "
                     f"(median {fit.median_us:.0f} us), {fit.held_out_share:.1%} of the step at "
                     "most")
    return lines


def _check_of(fit, gqa: dict, on: dict) -> dict:
    """The held-out check of a learned model (kvlab.predict.ahead.HeldOut) at the point of
    gqa's row and the lever's row `on`: its model, batch and prompt, and its own recorded change
    (a point recorded twice has two)."""
    recorded = 1e3 * (on["step_ms"] - gqa["step_ms"])
    return next(c for c in fit.checks if (c["model"], c["batch"], c["prompt"]) == (
        gqa["model"], gqa["batch"], gqa["prompt"]) and c["recorded_us"] == recorded)


def _learned_points() -> list[tuple[dict, dict, dict, str, dict]]:
    """(gqa's row, gqa+ahead's, kvlab.predict.ahead.ahead_effect there by its GPU's learned
    model, the recording "machine/name", the model's held-out check of the point) at each point
    of the lever's recordings."""
    from kvlab.predict.ahead import ahead_effect

    found = []
    for gqa, ahead, gbps, gpu, run in _ahead_pairs():
        fit = _learned(gpu)
        check = _check_of(fit, gqa, ahead)
        found.append((gqa, ahead, ahead_effect(gqa["model"], gqa["batch"],
                                               gqa["prompt"] + gqa["new_tokens"] / 2,
                                               ahead["ahead_bytes"], gbps, _step_model(), fit),
                      run, check))
    return found


def ahead_learned_table() -> list[str]:
    """Per point of the lever's recordings: the recorded change of a step, the learned one (its
    GPU's model, fitted on every point and with the point's model left out), the parts of the
    first and the step model's bound (us)."""
    lines = ["| recording | prompt | model | batch | ahead_bytes | recorded change | learned | "
             "its model left out | issue cost | hidden idle | bound |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for gqa, ahead, effect, run, check in _learned_points():
        lines.append(f"| {run} | {gqa['prompt']:,} | {gqa['model']} | {gqa['batch']} | "
                     f"{ahead['ahead_bytes'] / 2**20:.1f} MiB | {check['recorded_us']:+.0f} us | "
                     f"{effect['delta_us']:+.0f} us | {check['predicted_us']:+.0f} us | "
                     f"{effect['cost_us']:.0f} us | {effect['hidden_us']:.0f} us | "
                     f"-{effect['bound_us']:.0f} us |")
    return lines


def ahead_learned_summary() -> str:
    """At how many points the learned change, its model left out of the fit, has the recorded
    one's sign, and the size of the recorded change where it has not."""
    points = [(run, check) for *_, run, check in _learned_points()]
    missed = [(run, c) for run, c in points
              if (c["predicted_us"] > 0) != (c["recorded_us"] > 0)]
    text = (f"with each point's model left out of the fit, the learned change has the recorded "
            f"one's sign at {len(points) - len(missed)} of {len(points)} points")
    text += "".join(
        f"; not at {c['model']}, batch {c['batch']}, {c['prompt']:,} tokens ({run}), where the "
        f"recorded change is {c['recorded_us']:+.1f} us ({c['recorded_us'] / c['step_us']:+.2%} "
        "of the step)" for run, c in missed)
    if len(missed) > 1:
        largest = max(abs(c["recorded_us"]) / c["step_us"] for _, c in missed)
        text += f". Each miss is a change of at most {largest:.2%} of its step"
    return text


@functools.cache
def _kv_points() -> tuple[tuple[dict, dict, str, dict, object], ...]:
    """(gqa's row, gqa+ahead_kv's, the GPU, the learned model's held-out check of the point, the
    GPU's learned model) at each point of the K/V blocks' prefetch runs (KV_RUNS)."""
    from kvlab.predict.ahead import fit_kv_ahead

    points = []
    for gpu, machine, name in KV_RUNS:
        fit = fit_kv_ahead(gpu)
        for gqa, kv in lever_pairs(load_result(machine, name), lever=KV_LEVER):
            points.append((gqa, kv, gpu, _check_of(fit, gqa, kv), fit))
    return tuple(points)


def kv_measured_table() -> list[str]:
    """Per point of the K/V blocks' prefetch runs: the K/V a layer it prefetched, gqa's step
    and gqa+ahead_kv's, the speed-up, the recorded change of a step, the learned one with the
    point's model left out, and the tokens' check."""
    lines = ["| GPU | prompt | model | batch | K/V a layer | gqa ms a step | gqa+ahead_kv | "
             "speed-up | change | learned, its model left out | same tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for gqa, kv, gpu, check, _ in _kv_points():
        lines.append(_lever_row(gpu, gqa, kv, "ahead_kv_bytes",
                                f"{check['recorded_us']:+.0f} us",
                                f"{check['predicted_us']:+.0f} us"))
    return lines


def kv_measured_summary() -> str:
    """The speed-up's range per GPU, and at how many points the step grew."""
    parts = []
    for gpu in KV_RECORDED:
        speeds = [g["step_ms"] / k["step_ms"] for g, k, on, _, _ in _kv_points() if on == gpu]
        parts.append(f"{min(speeds):.3f}-{max(speeds):.3f}x gqa's speed on the {gpu}")
    slower = sum(k["step_ms"] > g["step_ms"] for g, k, *_ in _kv_points())
    same = sum(bool(k["same_tokens"]) for _, k, *_ in _kv_points())
    return (f"{' and '.join(parts)}: the step grew at {slower} of {len(_kv_points())} points, "
            f"and the greedy tokens were the same at {same}")


def kv_learned() -> list[str]:
    """Per GPU: the learned net cost, the recordings, the points and the held-out check."""
    lines = []
    for gpu in KV_RECORDED:
        fit = next(f for _, _, on, _, f in _kv_points() if on == gpu)
        lines.append(f"- {gpu} ({fit.sources}): a step grows by {fit.net_cost:.2f} of the "
                     f"prefetched bytes' time at the copy roofline (from {fit.steps} steps); on "
                     f"models left out, within {fit.held_out_us:.0f} us of the recorded change "
                     f"(median {fit.median_us:.0f} us), {fit.held_out_share:.1%} of the step at "
                     "most")
    return lines


_kv_delivery = functools.cache(kv_delivery)  # (the recorded counters', read once)


def kv_counters_table() -> list[str]:
    """Per step profiled without and with the K/V blocks' prefetch: the share of a layer's K and
    V it covers, ncu's share of the attention's and of the QKV linear's loaded bytes that hit
    L2, and the traced step (CUDA graphs, the same run)."""
    lines = ["| model | batch | prompt | prefetched a layer | share of its K/V | attention's L2 "
             "hits without | with | rise / share | QKV linear's L2 hits without -> with | "
             "traced step without -> with |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in KV_COUNTERS[1]:
        for base, on in kv_pairs(load_result(KV_COUNTERS[0], name)):
            before, after = base["counters"]["attention"], on["counters"]["attention"]
            rise = after["load_hit_share"] - before["load_hit_share"]
            qkv = [next((g["load_hit_share"] for g in r["counters"]["gemms"] or ()
                         if g["name"] == "qkv"), None) for r in (base, on)]
            lines.append(
                f"| {on['model']} | {on['batch']} | {on['prompt']:,} | "
                f"{on['ahead_kv_bytes'] / 2**20:.1f} MiB | {after['prefetched_share']:.0%} | "
                f"{before['load_hit_share']:.1%} | {after['load_hit_share']:.1%} | "
                f"{rise / after['prefetched_share']:.2f} | "
                f"{' -> '.join('-' if v is None else f'{v:.1%}' for v in qkv)} | "
                f"{base['span_us'] / 1e3:.3f} -> {on['span_us'] / 1e3:.3f} ms |")
    return lines


GEMM_PATHS = "gemm_paths"  # benchmarks/gemm_paths.py's result, one per GPU (results/<gpu>/)
# its columns: (the variant, the heading); the residual forms only the down projection has
GEMM_COLUMNS = (("cublas", "cuBLAS"), ("cublaslt", "cuBLASLt"),
                ("cublas+add", "cuBLAS, then an add"),
                ("cublas+addmm_", "cuBLAS, the residual in the GEMM"),
                ("cublaslt+add", "cuBLASLt, then an add"),
                ("cublaslt+addmm_", "cuBLASLt, the residual in the GEMM"))


def gemm_machines() -> list[str]:
    """The GPUs (results folders) with a gemm_paths result."""
    return sorted(p.parent.name for p in results_dir().glob(f"*/{GEMM_PATHS}.json"))


def gemm_paths_table(results: dict[str, dict]) -> list[str]:
    """`results` ({GPU: its gemm_paths result}) as a table: each linear's time a layer under
    each variant (and as a multiple of its bytes' time at the run's copy roofline), per model
    and row count; a sentence where there is none."""
    if not results:
        return ["No result of `benchmarks/gemm_paths.py` is committed yet."]
    lines = ["| GPU | model | linear | rows | " + " | ".join(h for _, h in GEMM_COLUMNS) + " |",
             "|---|---|---|---|" + "---|" * len(GEMM_COLUMNS)]
    for machine, result in results.items():
        for r in result["rows"]:
            cells = [f"{r['us_per_layer'][v]:.1f} us ({r['over_bytes'][v]:.2f}x)"
                     if v in r["us_per_layer"] else "-" for v, _ in GEMM_COLUMNS]
            lines.append(f"| {machine.upper()} | {r['model']} | {r['linear']} | "
                         f"{r['num_rows']} | " + " | ".join(cells) + " |")
    return lines


BLOCKS = {
    "e2e.source": lambda: [f"- {source('h200', name)}" for name in E2E_RESULTS],
    "e2e.rounds": lambda: ", ".join(sorted({str(load_result("h200", name)["rounds"])
                                            for name in E2E_RESULTS})),
    "e2e.summary": summary,
    "e2e.source-2048": lambda: source("h200", "e2e_2048"),
    "e2e.source-serving": lambda: source("h200", "e2e_serving"),
    "e2e.serving-summary": serving_summary,
    "e2e.hf-first-steps": hf_first_steps,
    "e2e.table": lambda: e2e_table(load_results("h200", E2E_RESULTS)),
    "e2e.table-2048": lambda: e2e_table(load_result("h200", "e2e_2048")),
    "e2e.serving": lambda: serving_table(load_result("h200", "e2e_serving")),
    "e2e.step-constants": step_model_constants,
    "e2e.step-model": step_model_table,
    "e2e.ahead-bound": ahead_bound_table,
    "e2e.ahead-bound-summary": ahead_bound_summary,
    "e2e.source-ahead": lambda: [f"- {source(machine, name)}" for _, machine, name in LEVER_RUNS],
    "e2e.ahead-measured": ahead_measured_table,
    "e2e.ahead-measured-summary": ahead_measured_summary,
    "e2e.ahead-targets": ahead_targets,
    "e2e.source-steptrace": lambda: "; ".join(source("h100", name) for name in TRACES),
    "e2e.steptrace": steptrace_table,
    "e2e.source-steptrace-h200": lambda: "; ".join(source("h200", name)
                                                   for name in recorded_traces("h200")),
    "e2e.steptrace-h200": lambda: steptrace_table("h200", recorded_traces("h200")),
    "e2e.steptrace-summary": steptrace_summary,
    "e2e.kv-prefetch-room": kv_prefetch_room,
    "e2e.target-cut": target_cut_table,
    "e2e.target-cut-summary": target_cut_summary,
    "e2e.source-linears": lambda: "; ".join(source(machine, name) for machine, names
                                            in GEMM_TRACES.items() for name in names),
    "e2e.linears": linear_table,
    "e2e.linears-summary": linear_summary,
    "e2e.gemm-paths-files": lambda: (", ".join(f"`{m}/{GEMM_PATHS}.json`"
                                               for m in gemm_machines()) or "none committed yet"),
    "e2e.source-gemm-paths": lambda: ("; ".join(source(m, GEMM_PATHS) for m in gemm_machines())
                                      or "none yet"),
    "e2e.gemm-paths": lambda: gemm_paths_table({m: load_result(m, GEMM_PATHS, {
        "rows": ("model", "linear", "num_rows", "us_per_layer", "over_bytes")})
        for m in gemm_machines()}),
    "e2e.window-bound": window_bound,
    "e2e.source-step-counters": lambda: "; ".join(source(COUNTERS[0], name)
                                                  for name in COUNTERS[1]),
    "e2e.step-counters": step_counters_table,
    "e2e.step-counters-summary": step_counters_summary,
    "e2e.step-counters-ratio": lambda: value_range(_hit_ratios(), unit=""),
    "e2e.ahead-learned-constants": ahead_learned_constants,
    "e2e.ahead-learned": ahead_learned_table,
    "e2e.ahead-learned-summary": ahead_learned_summary,
    "e2e.source-kv": lambda: [f"- {source(machine, name)}" for _, machine, name in KV_RUNS],
    "e2e.kv-measured": kv_measured_table,
    "e2e.kv-measured-summary": kv_measured_summary,
    "e2e.kv-learned": kv_learned,
    "e2e.source-kv-counters": lambda: "; ".join(source(KV_COUNTERS[0], name)
                                                for name in KV_COUNTERS[1]),
    "e2e.kv-counters": kv_counters_table,
    "e2e.kv-delivery": lambda: f"{_kv_delivery()[0]:.2f}",
    "e2e.kv-steps": lambda: f"{_kv_delivery()[1]} step{'' if _kv_delivery()[1] == 1 else 's'}",
    "e2e.streaming-delivery": lambda: f"{_learned('h100-sxm').delivery['streaming']:.2f}",
}
