"""The tables README.md and benchmarks/README.md show, made from the recorded results:

    python benchmarks/tables.py

prints them as Markdown. tests/test_docs.py checks that the READMEs hold exactly these lines, so
a table cannot drift from the data it cites. Ratios against a target print four digits: 0.9498
is not 0.950.
"""

from __future__ import annotations

import statistics

from kvlab.bench.e2e import prefetch_pairs
from kvlab.config import MODELS
from kvlab.results import load_result, load_results

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


# The small points of benchmarks/README.md's table of `attention_small.json`: (batch, context).
SMALL_POINTS = [(1, 32768), (1, 8192), (16, 1024)]


def small_table(result: dict, points=SMALL_POINTS) -> list[str]:
    """gqa (no prefetch) at small points, per model (results/h200/attention_small.json, gqa,
    SDPA and a plain read of the same bytes in one loop per point): its % of the copy roofline,
    its speed over SDPA's, and the read's % of the roofline."""
    def row(model, batch, context, kernel):
        return next(r for r in result["rows"] if r["kernel"] == kernel and
                    r["prefetch"] == "none" and (r["model"], r["batch"], r["context"]) == (
                        model, batch, context))

    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {_context(c)}" for b, c in points) + " |",
             "|---|" + "---|" * len(points)]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        cells = []
        for batch, context in points:
            gqa, sdpa, read = (row(model, batch, context, k) for k in ("gqa", "sdpa", "read"))
            cells.append(f"{gqa['pct_roofline']:.1f}% ({sdpa['ms'] / gqa['ms']:.3f}x SDPA; "
                         f"read {read['pct_roofline']:.1f}%)")
        lines.append(f"| {model} ({_heads(model)}) | " + " | ".join(cells) + " |")
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


def kvpr_table_1(rates: str = "spec") -> list[str]:
    """KVPR's Table 1 (A100 40GB, OPT, batch 32 x 1,024 tokens, per layer) beside kvlab's
    predictions (kvlab.offload.paper) with `rates`: "spec" peaks or "h200-share" (each peak times
    the share of it the H200 reaches in results/h200/)."""
    from kvlab.offload import paper

    return paper.table_1_markdown(paper.table_1_rows(rates=rates))


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
    kernel family, SM count and prefetch setting, the mean absolute error of the modelled hit
    rate of the loads (the target's; where the counters hold the loads' own hits) and of ncu's
    headline rate (every lookup), and the median relative error of the modelled time; then all
    together."""
    s = result["summary"]
    loads = s["hit_mae_points"]["near_hit_rate"] is not None
    lines = ["| kernel, SMs, prefetch | launches | "
             + ("loads' hit rate: mean abs. error | " if loads else "")
             + "ncu's hit rate (every lookup): mean abs. error | time: median error |",
             "|---|---|---|---|" + ("---|" if loads else "")]
    counts = {}
    for r in result["rows"]:
        block = "" if r["block_size"] == 16 else f", block {r['block_size']}"
        key = f"{r['kernel']}, {r['sms']} SMs, {r['prefetch']}{block}"
        counts[key] = counts.get(key, 0) + 1
    for key, g in result["summary"]["by_group"].items():
        if g["time_median_rel"] is None:
            time = "not timed"
        else:
            fitted = " (fitted)" if key.endswith(", 132 SMs, none") else ""
            time = f"{100 * g['time_median_rel']:.1f}%{fitted}"
        own = f"{g['hit_mae_points']:.1f} points | " if loads else ""
        lines.append(f"| {key} | {counts[key]} | {own}"
                     f"{g['headline_hit_mae_points']:.1f} points | {time} |")
    own = f"{s['hit_mae_points']['near_hit_rate']:.1f} points | " if loads else ""
    lines.append(f"| all | {s['configs']} | {own}"
                 f"{s['hit_mae_points']['ncu_hit_rate']:.1f} points | "
                 f"{100 * s['time_median_rel']:.1f}% ({s['time_checked']} not fitted; "
                 f"{100 * s['time_within_25pct']:.0f}% within 25%) |")
    return lines


# The counters' point of the Table 5.2 reproduction, (batch, context): the paper states none.
TABLE_5_2_POINT = (16, 4096)
# The prefetch setting `bench counters` profiles beside none.
COUNTERS_PREFETCH = "bulk K+V d=1"
# Table 5.2's rows: kvlab's column -> (short name, digits of ours)
TABLE_5_2_ROWS = {"l2_hit_pct": ("L2 hit rate, %", 1),
                  "long_scoreboard_cycles": ("long-scoreboard stall, cycles/inst", 2),
                  "cpi": ("CPI, cycles/inst", 2), "sm_throughput_pct": ("SM throughput, %", 1),
                  "memory_throughput_pct": ("memory throughput, %", 1)}


def _paper_models():
    from kvlab.profile import paper

    return sorted(paper.MODELS, key=lambda m: (MODELS[m].num_qo_heads // MODELS[m].num_kv_heads,
                                               m))


def table_5_2(result: dict, point=TABLE_5_2_POINT, num_sms: int | None = None) -> list[str]:
    """The paper's Table 5.2 on the H200 (results/h200/counters.json, one ncu launch each, L2
    flushed) at one point (default 16 x 4k: the paper states none): per kernel family and row,
    per model (GQA group order) "ours without -> with bulk K+V d=1", the paper's H20 figures
    without -> with, and ours / H20 without, with. After the paper's rows, one of ours alone:
    the hit rate of the loads' own lookups (l2_read_hit_bytes / l2_read_bytes; ncu's L2 hit rate
    counts the prefetches' and the L2 fabric's lookups too). The speedup row is ncu's baseline
    duration over the prefetch one (one cold launch each), beside the paper's."""
    from kvlab.profile import paper

    batch, context = point
    models = _paper_models()
    entries = {(e["kernel"], e["model"], e["column"]): e for e in result["table"]
               if (e["batch"], e["context"]) == (batch, context)
               and e["prefetch"] == COUNTERS_PREFETCH
               and (num_sms is None or e["num_sms_used"] == num_sms)}
    lines = [f"| kernel | Table 5.2 row (batch {batch} x {_context(context)}) | "
             + " | ".join(f"{m} ({_heads(m)})" for m in models) + " |",
             "|---|---|" + "---|" * len(models)]
    for kernel in ("vllm_v1", "gqa"):
        for column, (name, digits) in TABLE_5_2_ROWS.items():
            cells = []
            for m in models:
                e = entries[(kernel, m, column)]
                h20 = paper.TABLE_5_2[column][m]
                cells.append(f"{e['ours_baseline']:.{digits}f} → {e['ours_prefetch']:.{digits}f}"
                             f"<br>H20 {h20[0]:.2f} → {h20[1]:.2f}<br>ratio "
                             f"{e['ratio_baseline']:.2f}, {e['ratio_prefetch']:.2f}")
            lines.append(f"| {kernel} | {name} | " + " | ".join(cells) + " |")
        loads = {(r["model"], r["prefetch"]): 100 * r["l2_read_hit_bytes"] / r["l2_read_bytes"]
                 for r in result["rows"] if r["kernel"] == kernel
                 and (r["batch"], r["context"]) == (batch, context)
                 and (num_sms is None or r["num_sms_used"] == num_sms)
                 and "l2_read_hit_bytes" in r}  # recorded since revision af1c220
        if loads:
            cells = [f"{loads[(m, 'none')]:.1f} → {loads[(m, COUNTERS_PREFETCH)]:.1f}"
                     for m in models]
            lines.append(f"| {kernel} | L2 hit rate of the loads alone, % (ours only) | "
                         + " | ".join(cells) + " |")
        cells = [f"{entries[(kernel, m, 'speedup')]['ours_prefetch']:.2f}x<br>H20 "
                 f"{paper.SPEEDUP[m]:.2f}x<br>ratio "
                 f"{entries[(kernel, m, 'speedup')]['ratio_prefetch']:.2f}" for m in models]
        lines.append(f"| {kernel} | kernel speedup (ncu durations) | " + " | ".join(cells) + " |")
    return lines


def _counters_pairs(counters: dict) -> dict:
    """(kernel, SMs held, model, batch, context) -> (row without prefetch, row with bulk d=1)."""
    key = ("kernel", "num_sms_used", "model", "batch", "context")
    base = {tuple(r[k] for k in key): r for r in counters["rows"] if r["prefetch"] == "none"}
    return {tuple(r[k] for k in key): (base[tuple(r[k] for k in key)], r)
            for r in counters["rows"] if r["prefetch"] == COUNTERS_PREFETCH}


def regime_table(attention_sms: dict, counters_sms: dict) -> list[str]:
    """The regime map as Markdown (results/h200/attention_sms.json, counters_sms.json): per
    kernel family, SMs held and model (GQA group), the best prefetch setting's speedup over none
    in the same loop at each batch x context (bulk K+V d=1 unless marked "line"), and where the
    counters were recorded, ncu's L2 hit rate without -> with bulk K+V d=1; last, the range of
    ncu's DRAM throughput without prefetch over the counters' points."""
    from kvlab.viz.regime import regime_cells

    pairs = _counters_pairs(counters_sms)
    points = sorted({(r["batch"], r["context"]) for r in attention_sms["rows"]},
                    key=lambda p: (p[0] * p[1], p[0]))
    lines = ["| kernel | SMs | model (q:kv) | "
             + " | ".join(f"{b} x {_context(c)}" for b, c in points) + " | DRAM %, no prefetch |",
             "|---|---|---|" + "---|" * (len(points) + 1)]
    for kernel in ("vllm_v1", "gqa"):
        cells = {(c["sms"], c["model"], c["batch"], c["context"]): c
                 for c in regime_cells(attention_sms["rows"], kernel)}
        for sms in sorted({s for s, *_ in cells}, reverse=True):
            for model in _paper_models():
                row = []
                for b, c in points:
                    cell = cells[(sms, model, b, c)]
                    text = f"{cell['speedup']:.2f}x"
                    if not cell["prefetch"].startswith("bulk"):
                        text += f" ({cell['prefetch'].split()[0]})"
                    if (kernel, sms, model, b, c) in pairs:
                        none, bulk = pairs[(kernel, sms, model, b, c)]
                        text += f"<br>L2 {none['l2_hit_pct']:.0f} → {bulk['l2_hit_pct']:.0f}%"
                    row.append(text)
                dram = [none["dram_throughput_pct"] for (k, s, m, *_), (none, _) in pairs.items()
                        if (k, s, m) == (kernel, sms, model)]
                lines.append(f"| {kernel} | {sms} | {model} ({_heads(model)}) | "
                             + " | ".join(row) + f" | {min(dram):.0f}-{max(dram):.0f} |")
    return lines


def regime_summary_table(attention_sms: dict, counters_sms: dict) -> list[str]:
    """Per kernel family and SMs held: the best prefetch setting's speedup over none across the
    recorded points (median, range, points above 1.02x), and the medians over the counters'
    points of ncu's L2 hit rate, long-scoreboard stall and DRAM throughput, without -> with bulk
    K+V d=1."""
    from kvlab.viz.regime import regime_cells

    pairs = _counters_pairs(counters_sms)
    lines = ["| kernel | SMs | best prefetch / none: median (range) | above 1.02x | "
             "L2 hit rate, % | long-scoreboard stall | DRAM throughput, % |",
             "|---|---|---|---|---|---|---|"]
    for kernel in ("vllm_v1", "gqa"):
        cells = regime_cells(attention_sms["rows"], kernel)
        for sms in sorted({c["sms"] for c in cells}, reverse=True):
            speedups = [c["speedup"] for c in cells if c["sms"] == sms]
            mine = [p for (k, s, *_), p in pairs.items() if (k, s) == (kernel, sms)]

            def median(column, which, mine=mine):
                return statistics.median(p[which][column] for p in mine)

            counters = " | ".join(f"{median(col, 0):.{d}f} → {median(col, 1):.{d}f}" for col, d in (
                ("l2_hit_pct", 1), ("long_scoreboard_cycles", 2), ("dram_throughput_pct", 0)))
            lines.append(
                f"| {kernel} | {sms} | {statistics.median(speedups):.2f}x ({min(speedups):.2f}-"
                f"{max(speedups):.2f}x) | {sum(s > 1.02 for s in speedups)} of {len(speedups)} | "
                f"{counters} |")
    return lines


# gqa on fp8 against fp16: the points of benchmarks/README.md's table, (batch, context).
FP8_POINTS = [(1, 32768), (16, 1024), (16, 32768), (64, 4096), (64, 32768)]
FP8_LARGE_TOKENS = 512 * 1024  # "large shapes": batch x context from here


def vllm_table(attention_vllm: dict, vllm_own: dict) -> list[str]:
    """kvlab's vllm_v1 (no prefetch; results/h200/attention_vllm.json) against vLLM's own
    kernels, per model and point: vLLM's timed in the same loop (its "vllm_own" rows, built by
    benchmarks/vllm_cubin.sh) and vLLM's figures in results/h200/vllm_own.json (from
    ../shared/H200.md). A cell: kvlab's GB/s / vLLM's in the same loop (ratio) / the recorded
    figure (ratio), the variant; then how many points lie within 7% of each."""
    own = vllm_own["rows"]
    rows = attention_vllm["rows"]
    points = list(dict.fromkeys((r["batch"], r["context"]) for r in own))
    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {_context(c)}" for b, c in points) + " |",
             "|---|" + "---|" * len(points)]
    same_loop, recorded = [], []
    for model in dict.fromkeys(r["model"] for r in own):
        cells = []
        for batch, context in points:
            key = (model, batch, context)
            theirs = next(r for r in own if (r["model"], r["batch"], r["context"]) == key)
            mine = next(r for r in rows if r["kernel"] == "vllm_v1" and r["prefetch"] == "none"
                        and (r["model"], r["batch"], r["context"]) == key)
            beside = next(r for r in rows if r["kernel"] == "vllm_own" and
                          (r["model"], r["batch"], r["context"]) == key)
            same_loop.append(mine["gbps"] / beside["gbps"])
            recorded.append(mine["gbps"] / theirs["gbps"])
            cells.append(f"{mine['gbps']:,.0f} / {beside['gbps']:,.0f} ({same_loop[-1]:.3f}x) / "
                         f"{theirs['gbps']:,} ({recorded[-1]:.3f}x), {beside['vllm_variant']}")
        lines.append(f"| {model} ({_heads(model)}) | " + " | ".join(cells) + " |")
    for name, ratios in (("vLLM's kernels in the same loop", same_loop),
                         ("vLLM's recorded figures", recorded)):
        within = sum(abs(r - 1) <= 0.07 for r in ratios)
        lines.append(f"Within 7% of {name}: {within} of {len(ratios)} points; range "
                     f"{min(ratios):.3f}-{max(ratios):.3f}x.")
    return lines


# The recorded end-to-end runs of 256 new tokens (`load_results("h200", E2E_RESULTS)`).
E2E_RESULTS = ("e2e", "e2e_qwen7b", "e2e_qwen14b")


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


def fp8_table(result: dict, points=FP8_POINTS) -> list[str]:
    """gqa on an fp8 cache against the same shape on fp16, one loop per point
    (results/h200/attention_fp8.json): the fp16 time over the fp8 time (the tokens/s ratio) and
    fp8's % of the copy roofline (of the fp8 bytes it reads); then the range of the ratio over
    the large shapes (batch x context >= FP8_LARGE_TOKENS)."""
    def pair(model, batch, context):
        rows = {r["kernel"]: r for r in result["rows"] if r["prefetch"] == "none" and (
            r["model"], r["batch"], r["context"]) == (model, batch, context)}
        return rows["gqa"]["ms"] / rows["gqa_fp8"]["ms"], rows["gqa_fp8"]["pct_roofline"]

    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {_context(c)}" for b, c in points) + " |",
             "|---|" + "---|" * len(points)]
    for model in models:
        cells = [f"{ratio:.2f}x ({pct:.0f}%)" for ratio, pct in
                 (pair(model, b, c) for b, c in points)]
        lines.append(f"| {model} ({_heads(model)}) | " + " | ".join(cells) + " |")
    large = [pair(r["model"], r["batch"], r["context"])[0] for r in result["rows"]
             if r["kernel"] == "gqa_fp8" and r["prefetch"] == "none"
             and r["batch"] * r["context"] >= FP8_LARGE_TOKENS]
    lines.append(f"From {FP8_LARGE_TOKENS // 1024}k tokens ({len(large)} points): "
                 f"{min(large):.2f}-{max(large):.2f}x.")
    return lines


# Mixed-length points of benchmarks/README.md's table: (batch, lengths spec).
MIXED_POINTS = [(16, "lognormal:3200,16384"), (64, "lognormal:3200,16384"),
                (256, "lognormal:3200,32768"), (64, "lognormal:1536,2048"),
                (256, "lognormal:1536,2048")]


def mixed_table(result: dict, points=MIXED_POINTS) -> list[str]:
    """gqa on batches of mixed lengths (results/h200/attention_mixed.json), per model and point:
    its % of the copy roofline, and its speed over the same kernel with the split planned for the
    longest sequence (kernel "gqa_split_longest", same loop); vllm_v1's % and a plain read's of
    the batch's bytes beside."""
    def rows(model, batch, spec):
        return {r["kernel"]: r for r in result["rows"]
                if (r["model"], r["batch"], r.get("lengths")) == (model, batch, spec)}

    def head(batch, spec):
        mean, longest = (int(n) for n in spec.partition(":")[2].split(","))
        return f"{batch} x ~{mean / 1024:.1f}k (max {longest // 1024}k)"

    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    lines = ["| model (q:kv) | " + " | ".join(head(b, s) for b, s in points) + " |",
             "|---|" + "---|" * len(points)]
    for model in models:
        cells = []
        for batch, spec in points:
            r = rows(model, batch, spec)
            gain = r["gqa_split_longest"]["ms"] / r["gqa"]["ms"]
            cells.append(f"{r['gqa']['pct_roofline']:.1f}% ({gain:.2f}x; vllm_v1 "
                         f"{r['vllm_v1']['pct_roofline']:.0f}%; read "
                         f"{r['read']['pct_roofline']:.0f}%)")
        lines.append(f"| {model} ({_heads(model)}) | " + " | ".join(cells) + " |")
    return lines


# From this many tokens (batch x context) a point counts as large in block_order_table and
# read_table.
LARGE_TOKENS = 256 * 1024


def _loops(result: dict, keep=lambda r: True) -> dict:
    """The rows of a result that `keep` accepts, by point: (model, batch, context, lengths spec
    or None) -> {kernel: row}, the variants timed in that point's loop."""
    loops = {}
    for r in result["rows"]:
        if keep(r):
            key = (r["model"], r["batch"], r["context"], r.get("lengths"))
            loops.setdefault(key, {})[r["kernel"]] = r
    return loops


def _spread(ratios) -> str:
    return f"{min(ratios):.3f}-{max(ratios):.3f}x (median {statistics.median(ratios):.3f}x)"


def read_table(result: dict) -> list[str]:
    """gqa (no prefetch) and SDPA against a plain read of the same bytes, one loop per point
    (results/h200/attention_read.json), per model, below and from LARGE_TOKENS: the read's % of
    the copy roofline, and the range and median of each kernel's speed over the read's."""
    loops = _loops(result)
    lines = ["| model (q:kv) | points | read: % of the roofline | gqa / read | SDPA / read |",
             "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        for large in (False, True):
            points = [p for (m, batch, context, _), p in loops.items()
                      if m == model and (batch * context >= LARGE_TOKENS) == large]
            read = [p["read"]["pct_roofline"] for p in points]
            over = {k: [p["read"]["ms"] / p[k]["ms"] for p in points] for k in ("gqa", "sdpa")}
            lines.append(f"| {model} ({_heads(model)}) | {len(points)} "
                         f"{'from' if large else 'below'} {LARGE_TOKENS // 1024}k tokens | "
                         f"{min(read):.1f}-{max(read):.1f}% | {_spread(over['gqa'])} | "
                         f"{_spread(over['sdpa'])} |")
    return lines


def block_order_table(result: dict) -> list[str]:
    """Each family without prefetch on blocks in order against scattered blocks, and gqa against
    SDPA either way, one loop per point (results/h200/attention_block_order.json), per model:
    the range and median of the speed ratios; against SDPA, the points where gqa is at least as
    fast and the median over the large ones (batch x context >= LARGE_TOKENS)."""
    loops = _loops(result)

    def against_sdpa(points, kernel):
        ratios = [p["sdpa"]["ms"] / p[kernel]["ms"] for _, p in points]
        large = [p["sdpa"]["ms"] / p[kernel]["ms"] for tokens, p in points
                 if tokens >= LARGE_TOKENS]
        return (f"{sum(x >= 1 for x in ratios)} of {len(ratios)} (large: median "
                f"{statistics.median(large):.3f}x)")

    lines = ["| model (q:kv) | gqa, in order / scattered | vllm_v1, in order / scattered | "
             "gqa >= SDPA, scattered | gqa >= SDPA, in order |", "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        points = [(batch * context, p) for (m, batch, context, _), p in loops.items()
                  if m == model]
        gain = {f: [p[f]["ms"] / p[f"{f}_in_order"]["ms"] for _, p in points]
                for f in ("gqa", "vllm_v1")}
        lines.append(f"| {model} ({_heads(model)}) | {_spread(gain['gqa'])} | "
                     f"{_spread(gain['vllm_v1'])} | {against_sdpa(points, 'gqa')} | "
                     f"{against_sdpa(points, 'gqa_in_order')} |")
    return lines


def timeline_table(result: dict) -> list[str]:
    """Where a gqa step's time goes against a plain read of its bytes
    (results/h200/timeline.json): per point, the timed medians, the traced spans (the step's, its
    decode launch's and the read's), when a decode CTA has its block ids, has issued its first
    copies and holds its first tile, its time after its loop, and the merge's end after the
    decode launch's last CTA (medians of the traced steps). A batch of mixed lengths is named by
    its mean and longest length."""
    lines = ["| model (q:kv) | point | CTAs | timed, us: gqa / read | traced span, us: step / "
             "decode / read | per CTA, us: block ids / copies issued / first tile | after the "
             "loop, us | merge, us after the decode |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        p, ms = r["phases"], r["ms"]
        merge = p.get("merge_end_after_us")
        point = (f"{r['batch']}, mean {r['context']}, longest {r['max_context']}"
                 if "lengths" in r else f"{r['batch']} x {_context(r['context'])}")
        lines.append(
            f"| {r['model']} ({_heads(r['model'])}) | {point} | "
            f"{p['decode_ctas']} | {ms['gqa'] * 1000:.1f} / {ms['read'] * 1000:.1f} | "
            f"{p['step_span_us']:.1f} / {p['decode_span_us']:.1f} / {p['read_span_us']:.1f} | "
            f"{p['ready_us']:.2f} / {p['issued_us']:.2f} / {p['landed_us']:.2f} | "
            f"{p['epilogue_us']:.2f} | {'-' if merge is None else f'{merge:.2f}'} |")
    return lines


# The results ratio_targets_table reads, in its arguments' order.
RATIO_TARGET_RESULTS = ("attention", "attention_fp8", "attention_vllm", "vllm_own")
# The decode kernels' targets against the copy roofline: (batch, context) -> % at least, in
# results/h200/attention_small.json; every batch of results/h200/attention_mixed.json at least
# MIXED_TARGET.
SMALL_TARGETS = {(1, 32768): 80.0, (16, 1024): 70.0}
MIXED_TARGET = 85.0


def _pct(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.1f}%" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}-{hi:.1f}%"


def roofline_targets_table(small: dict, mixed: dict) -> list[str]:
    """The targets on gqa's % of the copy roofline (no prefetch; SMALL_TARGETS in
    results/h200/attention_small.json, MIXED_TARGET over results/h200/attention_mixed.json), per
    model: the points that meet the target, and those that miss it, apart by whether a plain
    read of the same bytes, timed in the same loop, reaches the target there."""
    def no_prefetch(r):
        return r["prefetch"] == "none"

    def rows(target, points):
        for model in dict.fromkeys(key[0] for key, _ in points):
            mine = [(p["gqa"]["pct_roofline"], p["read"]["pct_roofline"])
                    for key, p in points if key[0] == model]
            met = [g for g, _ in mine if g >= target]
            cells = [f"{len(met)} of {len(mine)}" + (f": {_pct(met)}" if met else "")]
            for read_reaches in (True, False):
                missed = [(g, r) for g, r in mine if g < target and (r >= target) == read_reaches]
                cells.append(f"{len(missed)}: gqa {_pct([g for g, _ in missed])}, read "
                             f"{_pct([r for _, r in missed])}" if missed else "-")
            yield f"| {model} ({_heads(model)}) | " + " | ".join(cells) + " |"

    lines = ["| target | model (q:kv) | met | missed, where a read reaches the target | missed, "
             "where a read does not |", "|---|---|---|---|---|"]
    for (batch, context), target in SMALL_TARGETS.items():
        points = [(k, p) for k, p in _loops(small, no_prefetch).items()
                  if k[1:3] == (batch, context)]
        lines += [f"| {batch} x {_context(context)} at {target:.0f}% " + line
                  for line in rows(target, points)]
    lines += [f"| mixed lengths at {MIXED_TARGET:.0f}% " + line
              for line in rows(MIXED_TARGET, list(_loops(mixed, no_prefetch).items()))]
    return lines


def ratio_targets_table(grid: dict, fp8: dict, attention_vllm: dict,
                        vllm_own: dict) -> list[str]:
    """The decode kernels' targets on speed ratios, per model: gqa (no prefetch) at least SDPA's
    speed at every point of results/h200/attention.json; gqa on fp8 at least 1.8x fp16's
    tokens/s from FP8_LARGE_TOKENS (results/h200/attention_fp8.json); vllm_v1 within 7% of
    vLLM's recorded figures (results/h200/attention_vllm.json against vllm_own.json). A cell: the
    points that meet it, and the range of the ratio over all of them."""
    def pairs(result, over, under, keep=lambda r: True):
        loops = _loops(result, lambda r: r["prefetch"] == "none" and r["block_size"] in (16, None)
                       and keep(r))
        return {key: p[over]["ms"] / p[under]["ms"] for key, p in loops.items()}

    own = {(r["model"], r["batch"], r["context"]): r["gbps"] for r in vllm_own["rows"]}
    ours = {(r["model"], r["batch"], r["context"]): r["gbps"] for r in attention_vllm["rows"]
            if r["kernel"] == "vllm_v1" and r["prefetch"] == "none"}
    targets = [
        ("gqa at least SDPA's speed", pairs(grid, "sdpa", "gqa"), lambda x: x >= 1),
        (f"fp8 at least 1.8x fp16's tokens/s, from {FP8_LARGE_TOKENS // 1024}k tokens",
         pairs(fp8, "gqa", "gqa_fp8", lambda r: r["batch"] * r["context"] >= FP8_LARGE_TOKENS),
         lambda x: x >= 1.8),
        ("vllm_v1 within 7% of vLLM's own", {key: ours[key] / gbps for key, gbps in own.items()},
         lambda x: abs(x - 1) <= 0.07)]
    models = list(dict.fromkeys(key[0] for key in own))
    lines = ["| target | " + " | ".join(f"{m} ({_heads(m)})" for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for name, ratios, meets in targets:
        cells = []
        for model in models:
            mine = [x for key, x in ratios.items() if key[0] == model]
            cells.append(f"{sum(map(meets, mine))} of {len(mine)} "
                         f"({min(mine):.3f}-{max(mine):.3f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    attention = load_result("h200", "attention")
    print("\n".join(decode_table(attention)), end="\n\n")
    kvpr = {name: load_result("h200", name) for name in ("kvpr_opt", "kvpr_llama")}
    print("\n".join(kvpr_table(kvpr)), end="\n\n")
    for rates in ("spec", "h200-share"):
        print("\n".join(kvpr_table_1(rates)), end="\n\n")
    print("\n".join(dashboard_table(load_result("cpu", "dashboard"))), end="\n\n")
    print("\n".join(l2_validation_table(load_result("cpu", "l2_validation"))), end="\n\n")
    print("\n".join(table_5_2(load_result("h200", "counters"))), end="\n\n")
    sms = load_result("h200", "attention_sms"), load_result("h200", "counters_sms")
    print("\n".join(regime_summary_table(*sms)), end="\n\n")
    print("\n".join(regime_table(*sms)), end="\n\n")
    print("\n".join(fp8_table(load_result("h200", "attention_fp8"))), end="\n\n")
    print("\n".join(e2e_table(load_results("h200", E2E_RESULTS))), end="\n\n")
    print("\n".join(e2e_table(load_result("h200", "e2e_2048"))), end="\n\n")
    print("\n".join(serving_table(load_result("h200", "e2e_serving"))), end="\n\n")
    print("\n".join(small_table(load_result("h200", "attention_small"))), end="\n\n")
    print("\n".join(vllm_table(load_result("h200", "attention_vllm"),
                               load_result("h200", "vllm_own"))), end="\n\n")
    print("\n".join(mixed_table(load_result("h200", "attention_mixed"))), end="\n\n")
    print("\n".join(block_order_table(load_result("h200", "attention_block_order"))),
          end="\n\n")
    print("\n".join(read_table(load_result("h200", "attention_read"))), end="\n\n")
    print("\n".join(timeline_table(load_result("h200", "timeline"))), end="\n\n")
    print("\n".join(timeline_table(load_result("h200", "timeline_mixed"))), end="\n\n")
    print("\n".join(roofline_targets_table(load_result("h200", "attention_small"),
                                            load_result("h200", "attention_mixed"))), end="\n\n")
    print("\n".join(ratio_targets_table(*(load_result("h200", name)
                                           for name in RATIO_TARGET_RESULTS))), end="\n\n")
    for mode, (worst, median, within, total) in auto_summary(attention).items():
        print(f"auto ({mode}): worst {worst:.3f}x, median {median:.3f}x, within 3% at {within} "
              f"of {total}")


if __name__ == "__main__":
    main()
