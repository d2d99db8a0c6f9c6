"""KVPR on the H200 (results/h200/kvpr_*.json) and the paper's Table 1 predicted.
"""

from __future__ import annotations

import statistics

from kvlab.config import MODELS
from kvlab.results import load_result

from .common import context_label, source, value_range

GRID = ("kvpr_opt", "kvpr_llama")
# At least this much faster than full transfer: multi-head attention from MHA_TOKENS a sequence.
MHA_TARGET, MHA_TOKENS = 1.6, 1024
LOWER_BOUND_TARGET = 1.15  # at most this many times the lower bound

# KVPR points of benchmarks/README.md's table: (result, model, batch, context).
KVPR_POINTS = [("kvpr_opt", "opt-6.7b", 8, 512), ("kvpr_opt", "opt-6.7b", 16, 1024),
               ("kvpr_opt", "opt-6.7b", 8, 8192), ("kvpr_opt", "opt-13b", 8, 1024),
               ("kvpr_opt", "opt-13b", 64, 512), ("kvpr_opt", "opt-30b", 8, 512),
               ("kvpr_opt", "opt-30b", 16, 1024), ("kvpr_llama", "llama2-7b", 8, 512),
               ("kvpr_llama", "llama2-7b", 16, 1024), ("kvpr_llama", "llama2-7b", 8, 8192),
               ("kvpr_llama", "llama3-8b", 8, 1024), ("kvpr_llama", "llama3-8b", 16, 8192)]


def kvpr_table(results: dict[str, dict], points=KVPR_POINTS) -> list[str]:
    """Per point: full transfer, the pipelined model's KVPR split, its speedup over full
    transfer and ratio to the lower bound, and HF's offloaded cache (median steps, all timed in
    turn at steady state)."""
    lines = ["| model, batch x context | full transfer | KVPR (pipelined l) | vs full | "
             "x lower bound | HF offloaded | vs HF |",
             "|---|---|---|---|---|---|---|"]
    for name, model, batch, context in points:
        rows = {r["setting"]: r for r in results[name]["rows"]
                if (r["model"], r["batch"], r["context"]) == (model, batch, context)
                and r.get("schedule", "row") == "row" and r.get("gpu_batches", 1) == 1}
        full, kvpr, hf = rows["full-transfer"], rows["kvpr-pipelined"], rows.get("hf-offloaded")
        hf_text, versus = "-", "-"
        if hf is not None:
            hf_text = f"{hf['step_ms']:.1f} ms"
            versus = f"{hf['step_ms'] / kvpr['step_ms']:.3f}x"
        lines.append(
            f"| {MODELS[model].name}, {batch} x {context_label(context)} | "
            f"{full['step_ms']:.1f} ms | "
            f"{kvpr['step_ms']:.1f} ms (l={kvpr['l']}) | "
            f"{full['step_ms'] / kvpr['step_ms']:.3f}x | {kvpr['ratio_to_lower_bound']:.3f} | "
            f"{hf_text} | {versus} |")
    return lines


def kvpr_table_1(rates: str = "spec") -> list[str]:
    """KVPR's Table 1 (A100 40GB, OPT, batch 32 x 1,024 tokens, per layer) beside kvlab's
    predictions (kvlab.offload.paper) with `rates`: "spec" peaks or "h200-share" (each peak times
    the share of it the H200 reaches in results/h200/)."""
    from kvlab.offload import paper

    return paper.table_1_markdown(paper.table_1_rows(rates=rates))


def points(names=GRID, schedule="row", gpu_batches=1, weights="resident") -> dict:
    """(model, batch, context[, weights]) -> {setting: row} over the results `names`, for one
    schedule and number of GPU batches."""
    found = {}
    for name in names:
        for r in load_result("h200", name)["rows"]:
            if (r["schedule"], r["gpu_batches"]) == (schedule, gpu_batches) and (
                    weights is None or r["weights"] == weights):
                key = (r["model"], r["batch"], r["context"])
                key += (r["weights"],) if weights is None else ()
                found.setdefault(key, {})[r["setting"]] = r
    return found


def fastest(settings: dict) -> dict:
    """The fastest KVPR setting's row of one point."""
    return min((r for s, r in settings.items() if s.startswith("kvpr-")),
               key=lambda r: r["step_ms"])


def multi_head(model: str) -> bool:
    return MODELS[model].num_qo_heads == MODELS[model].num_kv_heads


def grid_summary() -> list[str]:
    """The grid against its targets, one bullet each."""
    grid = points()
    bound = {k: fastest(p)["ratio_to_lower_bound"] for k, p in grid.items()}
    missed = sorted((r, k) for k, r in bound.items() if r > LOWER_BOUND_TARGET)
    mha = [p["full-transfer"]["step_ms"] / fastest(p)["step_ms"] for (m, b, c), p in grid.items()
           if multi_head(m) and c >= MHA_TOKENS]
    model_error = [p["kvpr-pipelined"]["step_ms"] / p["kvpr-pipelined"]["predicted_pipelined_ms"]
                   for p in grid.values()]
    gqa = [p for (m, *_), p in grid.items() if not multi_head(m)]
    gqa_speed = value_range([p["full-transfer"]["step_ms"] / fastest(p)["step_ms"] for p in gqa],
                            "{:.3f}")
    return [
        f"- **At most {LOWER_BOUND_TARGET}x the lower bound** (the fastest KVPR setting) at "
        f"{len(grid) - len(missed)} of {len(grid)} points; the misses: " + ", ".join(
            f"{MODELS[m].name} {b} x {context_label(c)} ({r:.2f}x)" for r, (m, b, c) in missed)
        + ". The bound leaves out the layer's own work, which shares the GPU with the "
        "recomputation; against the pipelined model, which counts it and the host, the steps "
        f"take {value_range(model_error)} (median {statistics.median(model_error):.2f}x).",
        f"- **Multi-head attention from {MHA_TOKENS // 1024}k tokens, at least {MHA_TARGET}x "
        f"faster than full transfer**: at {sum(x >= MHA_TARGET for x in mha)} of {len(mha)} "
        f"points ({value_range(mha)}).",
        f"- **GQA**: the pipelined model chooses l = "
        f"{', '.join(sorted({str(p['kvpr-pipelined']['l']) for p in gqa}))} at every point, and "
        f"the fastest setting runs {gqa_speed} as fast as full transfer: K, V with "
        "few heads cost less to send than X."]


def against_hf() -> list[str]:
    """HF's offloaded cache, timed in turn at steady state: over full transfer and against the
    fastest KVPR setting, for multi-head and GQA models."""
    grid = {k: p for k, p in points().items() if "hf-offloaded" in p}
    lines = []
    for name, keep in (("multi-head attention", multi_head),
                       ("GQA", lambda m: not multi_head(m))):
        mine = [p for (m, *_), p in grid.items() if keep(m)]
        over_full = [p["hf-offloaded"]["step_ms"] / p["full-transfer"]["step_ms"] for p in mine]
        over_kvpr = [p["hf-offloaded"]["step_ms"] / fastest(p)["step_ms"] for p in mine]
        lines.append(f"- {name}, {len(mine)} points: HF's step takes {value_range(over_full)} full "
                     f"transfer's, and KVPR runs {value_range(over_kvpr)} faster than HF.")
    return lines


def ablations() -> list[str]:
    """Each ablation (eager enqueue, four chunks) against the grid's CUDA graphs and one chunk at
    the same points: the host's time per unit and the fastest KVPR step over full transfer."""
    grid = points()
    lines = ["| ablation | point | host per unit, ms: ablation / grid | fastest KVPR over full "
             "transfer: ablation / grid |", "|---|---|---|---|"]
    for name, label in (("kvpr_eager", "eager (no CUDA graphs)"), ("kvpr_chunks4", "4 chunks")):
        for key, p in points((name,)).items():
            g = grid[key]
            gains = [q["full-transfer"]["step_ms"] / fastest(q)["step_ms"] for q in (p, g)]
            lines.append(
                f"| {label} | {MODELS[key[0]].name} {key[1]} x {context_label(key[2])} | "
                f"{fastest(p)['unit_host_ms']:.2f} / {fastest(g)['unit_host_ms']:.2f} | "
                f"{gains[0]:.2f}x / {gains[1]:.2f}x |")
    return lines


def schedules() -> list[str]:
    """The column schedule in 4 GPU batches (kvpr_schedules.json), weights resident and
    offloaded: the fastest KVPR setting over full transfer, its l and its ratio to the lower
    bound."""
    found = points(("kvpr_schedules",), schedule="column", gpu_batches=4, weights=None)
    lines = ["| model, batch x context | weights | fastest KVPR over full transfer | l | x lower "
             "bound |", "|---|---|---|---|---|"]
    for (model, batch, context, weights), p in found.items():
        best = fastest(p)
        lines.append(f"| {MODELS[model].name}, {batch} x {context_label(context)} | {weights} | "
                     f"{p['full-transfer']['step_ms'] / best['step_ms']:.2f}x | {best['l']} | "
                     f"{best['ratio_to_lower_bound']:.2f} |")
    return lines


BLOCKS = {
    "kvpr.source-grid": lambda: " and ".join(source("h200", name) for name in GRID),
    "kvpr.grid-size": lambda: f"{len(points())} points",
    "kvpr.summary": grid_summary,
    "kvpr.against-hf": against_hf,
    "kvpr.ablations": ablations,
    "kvpr.source-ablations": lambda: " and ".join(source("h200", name)
                                                  for name in ("kvpr_eager", "kvpr_chunks4")),
    "kvpr.schedules": schedules,
    "kvpr.source-schedules": lambda: source("h200", "kvpr_schedules"),
    "kvpr.table": lambda: kvpr_table({name: load_result("h200", name)
                                      for name in ("kvpr_opt", "kvpr_llama")}),
    "kvpr.table-1": lambda: kvpr_table_1("spec"),
    "kvpr.table-1-h200-share": lambda: kvpr_table_1("h200-share"),
}
