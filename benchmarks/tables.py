"""The tables README.md and benchmarks/README.md show, made from the recorded results:

    python benchmarks/tables.py

prints them as Markdown. tests/test_docs.py checks that the READMEs hold exactly these lines, so
a table cannot drift from the data it cites. Ratios against a target print four digits: 0.9498
is not 0.950.
"""

from __future__ import annotations

import statistics

from kvlab.config import MODELS
from kvlab.results import load_result

# The decode-attention points of the README's headline table: (model, batch, context).
DECODE_POINTS = [(model, batch, context) for model in ("llama2-7b", "llama3-8b", "qwen2.5-7b",
                                                       "qwen2.5-14b")
                 for batch, context in ((1, 32768), (16, 1024), (64, 8192))]
# KVPR points of benchmarks/README.md's table: (result, model, batch, context).
KVPR_POINTS = [("kvpr_opt", "opt-6.7b", 8, 512), ("kvpr_opt", "opt-6.7b", 16, 1024),
               ("kvpr_opt", "opt-6.7b", 8, 8192), ("kvpr_opt", "opt-13b", 8, 1024),
               ("kvpr_opt", "opt-13b", 64, 512), ("kvpr_opt", "opt-30b", 8, 512),
               ("kvpr_opt", "opt-30b", 16, 1024), ("kvpr_llama", "llama2-7b", 8, 512),
               ("kvpr_llama", "llama2-7b", 16, 1024), ("kvpr_llama", "llama2-7b", 8, 8192),
               ("kvpr_llama", "llama3-8b", 8, 1024), ("kvpr_llama", "llama3-8b", 16, 8192)]


def _heads(model: str) -> str:
    m = MODELS[model]
    return f"{m.num_qo_heads}:{m.num_kv_heads}"


def _context(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 else str(tokens)


def decode_table(result: dict, points=DECODE_POINTS) -> list[str]:
    """Per point (one loop of `python -m kvlab bench attention`): vllm_v1 and its best prefetch
    setting, gqa and its % of the copy roofline, SDPA, and gqa's speed over SDPA's."""
    lines = ["| model (q:kv) | batch x context | vllm_v1 | vllm_v1, best prefetch | gqa (% of "
             "roofline) | SDPA | gqa / SDPA |", "|---|---|---|---|---|---|---|"]
    for model, batch, context in points:
        rows = [r for r in result["rows"] if (r["model"], r["batch"], r["context"]) == (
            model, batch, context) and r["block_size"] in (16, None)]
        (loop,) = {r["loop"] for r in rows}
        mine = [r for r in result["rows"] if r["loop"] == loop]

        def one(kernel, prefetch, mine=mine):
            return next(r for r in mine if r["kernel"] == kernel and r["prefetch"] == prefetch)

        vllm, gqa, sdpa = one("vllm_v1", "none"), one("gqa", "none"), one("sdpa", "none")
        best = min((r for r in mine if r["kernel"] == "vllm_v1"), key=lambda r: r["ms"])
        lines.append(
            f"| {model} ({_heads(model)}) | {batch} x {_context(context)} | {vllm['gbps']:,.0f} | "
            f"{best['gbps']:,.0f} ({vllm['ms'] / best['ms']:.2f}x, {best['prefetch']}) | "
            f"{gqa['gbps']:,.0f} ({gqa['pct_roofline']:.0f}%) | {sdpa['gbps']:,.0f} | "
            f"{sdpa['ms'] / gqa['ms']:.4f} |")
    return lines


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
            f"| {MODELS[model].name}, {batch} x {_context(context)} | {full['step_ms']:.1f} ms | "
            f"{kvpr['step_ms']:.1f} ms (l={kvpr['l']}) | "
            f"{full['step_ms'] / kvpr['step_ms']:.3f}x | {kvpr['ratio_to_lower_bound']:.3f} | "
            f"{hf_text} | {versus} |")
    return lines


def auto_summary(result: dict) -> dict[str, tuple[float, float, int, int]]:
    """kernel="auto" per mode: (worst ratio to the fastest setting of its family in the same
    loop, median ratio, loops within 3%, loops)."""
    from kvlab.bench.attention import loop_ratios

    found = {}
    for entry in loop_ratios(result["rows"]).values():
        for (_, mode), ratio in entry["auto"].items():
            found.setdefault(mode, []).append(ratio)
    return {mode: (max(r), statistics.median(r), sum(x <= 1.03 for x in r), len(r))
            for mode, r in found.items()}


def dashboard_table(result: dict) -> list[str]:
    """The dashboard's start-up and redraw times (results/cpu/dashboard.json) against targets."""
    names = {"dashboard_python_s": "`kvlab.dashboard()` in a fresh Python process",
             "first_chart_s": "first chart in a fresh kernel (JupyterLab, Chromium)",
             "redraw_s": "slider change to chart redrawn in the page"}
    lines = ["| what | min | median | max | runs | target (median) |", "|---|---|---|---|---|---|"]
    for key, name in names.items():
        s = result[key]
        lines.append(f"| {name} | {s['min']:.3f} s | {s['median']:.3f} s | {s['max']:.3f} s | "
                     f"{len(s['runs'])} | {result['targets_s'][key]:g} s |")
    return lines


def l2_validation_table(result: dict) -> list[str]:
    """The L2 model against ncu and the measured times (results/cpu/l2_validation.json): per
    kernel family, SM count and prefetch setting, the mean absolute error of the modelled hit rate
    (as ncu counts it) and the median relative error of the modelled time; then all together."""
    lines = ["| kernel, SMs, prefetch | launches | hit rate: mean abs. error | "
             "time: median error |", "|---|---|---|---|"]
    counts = {}
    for r in result["rows"]:
        key = f"{r['kernel']}, {r['sms']} SMs, {r['prefetch']}"
        counts[key] = counts.get(key, 0) + 1
    for key, g in result["summary"]["by_group"].items():
        fitted = " (fitted)" if ", 132 SMs, none" in key else ""
        lines.append(f"| {key} | {counts[key]} | {g['hit_mae_points']:.1f} points | "
                     f"{100 * g['time_median_rel']:.1f}%{fitted} |")
    s = result["summary"]
    lines.append(f"| all | {s['configs']} | {s['hit_mae_points']['lookup_hit_rate']:.1f} points | "
                 f"{100 * s['time_median_rel']:.1f}% ({s['time_checked']} not fitted; "
                 f"{100 * s['time_within_25pct']:.0f}% within 25%) |")
    return lines


def main() -> None:
    attention = load_result("h200", "attention")
    print("\n".join(decode_table(attention)), end="\n\n")
    kvpr = {name: load_result("h200", name) for name in ("kvpr_opt", "kvpr_llama")}
    print("\n".join(kvpr_table(kvpr)), end="\n\n")
    print("\n".join(dashboard_table(load_result("cpu", "dashboard"))), end="\n\n")
    print("\n".join(l2_validation_table(load_result("cpu", "l2_validation"))), end="\n\n")
    for mode, (worst, median, within, total) in auto_summary(attention).items():
        print(f"auto ({mode}): worst {worst:.3f}x, median {median:.3f}x, within 3% at {within} "
              f"of {total}")


if __name__ == "__main__":
    main()
