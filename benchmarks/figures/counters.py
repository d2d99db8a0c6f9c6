"""Nsight Compute counters (results/h200/counters*.json) and the SM regime map
(attention_sms.json): the paper's Table 5.2 on the H200.
"""

from __future__ import annotations

import statistics

from kvlab.config import MODELS
from kvlab.results import load_result

from .common import context_label, heads, value_range

# The counters' point of the Table 5.2 reproduction, (batch, context): the paper states none.
TABLE_5_2_POINT = (16, 4096)


# The prefetch setting `bench counters` profiles beside none.
COUNTERS_PREFETCH = "bulk K+V d=1"


# A best-prefetch speedup counts as a gain above this (the regime tables' "above" column).
GAIN = 1.02


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
    lines = [f"| kernel | Table 5.2 row (batch {batch} x {context_label(context)}) | "
             + " | ".join(f"{m} ({heads(m)})" for m in models) + " |",
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
             + " | ".join(f"{b} x {context_label(c)}" for b, c in points)
             + " | DRAM %, no prefetch |",
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
                lines.append(f"| {kernel} | {sms} | {model} ({heads(model)}) | "
                             + " | ".join(row) + f" | {min(dram):.0f}-{max(dram):.0f} |")
    return lines


def regime_summary_table(attention_sms: dict, counters_sms: dict) -> list[str]:
    """Per kernel family and SMs held: the best prefetch setting's speedup over none across the
    recorded points (median, range, points above 1.02x), and the medians over the counters'
    points of ncu's L2 hit rate, long-scoreboard stall and DRAM throughput, without -> with bulk
    K+V d=1."""
    from kvlab.viz.regime import regime_cells

    pairs = _counters_pairs(counters_sms)
    lines = [f"| kernel | SMs | best prefetch / none: median (range) | above {GAIN:.2f}x | "
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
                f"{max(speedups):.2f}x) | {sum(s > GAIN for s in speedups)} of {len(speedups)} | "
                f"{counters} |")
    return lines


BLOCKS = {
    "counters.table-5-2": lambda: table_5_2(load_result("h200", "counters")),
    "counters.regime-summary": lambda: regime_summary_table(load_result("h200", "attention_sms"),
                                                         load_result("h200", "counters_sms")),
    "counters.regime": lambda: regime_table(load_result("h200", "attention_sms"),
                                         load_result("h200", "counters_sms")),
}


# ---- Figures inside the sentences of docs/counters.md ----------------------------------------

def _sms():
    return load_result("h200", "attention_sms"), load_result("h200", "counters_sms")


def _speedups(kernel: str, sms: int, keep=lambda cell: True) -> list[float]:
    """The best prefetch setting's speedup over none at each recorded point of `kernel` on
    `sms` SMs (attention_sms.json)."""
    from kvlab.viz.regime import regime_cells

    return [c["speedup"] for c in regime_cells(_sms()[0]["rows"], kernel)
            if c["sms"] == sms and keep(c)]


def _pairs(kernel: str, sms: int, models=None) -> list[tuple[dict, dict]]:
    """(without, with bulk K+V d=1) counters of `kernel` on `sms` SMs (counters_sms.json)."""
    return [p for (k, s, m, *_), p in _counters_pairs(_sms()[1]).items()
            if (k, s) == (kernel, sms) and (models is None or m in models)]


def _gqa_models() -> list[str]:
    return [m for m in _paper_models() if MODELS[m].num_qo_heads > MODELS[m].num_kv_heads]


def _range(values, fmt="{:.0f}", unit="") -> str:
    return value_range(values, fmt, unit)


def _median_x(kernel, sms) -> str:
    return f"{statistics.median(_speedups(kernel, sms)):.2f}x"


def _above(kernel, sms) -> str:
    found = _speedups(kernel, sms)
    return f"{sum(s > GAIN for s in found)} of {len(found)}"


def _counter_median(kernel, sms, column, digits=2, unit="") -> str:
    pairs = _pairs(kernel, sms)
    return " → ".join(f"{statistics.median(p[i][column] for p in pairs):.{digits}f}{unit}"
                      for i in (0, 1))


def _dram_none(kernel, sms, models=None) -> str:
    return _range([none["dram_throughput_pct"] for none, _ in _pairs(kernel, sms, models)],
                  unit="%")


def _gains_at_132() -> str:
    """Where `vllm_v1` gains more than 2% on the whole GPU: "llama2-7b 1 x 4k 1.06x, ..."."""
    from kvlab.viz.regime import regime_cells

    cells = sorted((c for c in regime_cells(_sms()[0]["rows"], "vllm_v1")
                    if c["sms"] == 132 and c["speedup"] > GAIN),
                   key=lambda c: (c["batch"], c["context"], c["speedup"]))
    return ", ".join(f"{c['model']} {c['batch']} x {context_label(c['context'])} "
                     f"{c['speedup']:.2f}x" for c in cells)


def _reread(kernel, sms, models) -> str:
    """How many bytes the loads ask of L2 per byte read from DRAM, without prefetch."""
    return _range([none["l2_read_bytes"] / none["dram_read_bytes"]
                   for none, _ in _pairs(kernel, sms, models)], "{:.2f}", "x")


def _column_range(kernel, sms, column, which, models=None, fmt="{:.0f}", unit="%") -> str:
    return _range([p[which][column] for p in _pairs(kernel, sms, models)], fmt, unit)


def _table_point(kernel: str, column: str, models, which: int) -> str:
    """Ours at the Table 5.2 point (counters.json), without (0) or with (1) bulk K+V d=1."""
    prefetch = "none" if which == 0 else COUNTERS_PREFETCH
    return _range([r[column] for r in load_result("h200", "counters")["rows"]
                   if r["kernel"] == kernel and r["prefetch"] == prefetch and r["model"] in models
                   and (r["batch"], r["context"]) == TABLE_5_2_POINT], "{:.1f}", "")


def _h20(column: str, models, which: int) -> str:
    from kvlab.profile import paper

    return _range([paper.TABLE_5_2[column][m][which] for m in models], "{:.2f}", "")


def _ncu_speedups(kernel: str) -> str:
    """ncu's duration without over with bulk K+V d=1 at the Table 5.2 point, over the models."""
    table = load_result("h200", "counters")["table"]
    return _range([e["ours_prefetch"] for e in table if e["kernel"] == kernel
                   and e["column"] == "speedup" and (e["batch"], e["context"]) == TABLE_5_2_POINT],
                  "{:.2f}", "x")


def _over_100() -> str:
    """Launches whose ncu memory throughput exceeds 100%, of counters_sms.json's."""
    rows = _sms()[1]["rows"]
    over = [r["memory_throughput_pct"] for r in rows if r["memory_throughput_pct"] > 100]
    return f"{len(over)} of {len(rows)} launches, up to {max(over):.1f}%"


def _over_100_where() -> str:
    rows = [r for r in _sms()[1]["rows"] if r["memory_throughput_pct"] > 100]
    kinds = {(r["kernel"], r["num_sms_used"], r["prefetch"]) for r in rows}
    dram = _range([r["dram_throughput_pct"] for r in rows], unit="%")
    return "; ".join(f"{k} on {s} SMs with {p}" for k, s, p in sorted(kinds)) + (
        f", DRAM at {dram}")


def _whole_vs_green() -> str:
    """How far whole-GPU counters (counters.json) and a 132-SM green context (counters_sms.json)
    lie apart at their common launches: hit-rate points and duration ratio."""
    key = ("kernel", "model", "batch", "context", "prefetch")
    whole = {tuple(r[k] for k in key): r for r in load_result("h200", "counters")["rows"]}
    common = [(whole[tuple(r[k] for k in key)], r) for r in _sms()[1]["rows"]
              if r["num_sms_used"] == 132 and tuple(r[k] for k in key) in whole]
    hit = max(abs(a["l2_hit_pct"] - b["l2_hit_pct"]) for a, b in common)
    time = max(abs(a["duration_us"] / b["duration_us"] - 1) for a, b in common)
    return (f"{len(common)} launches: within {hit:.1f} points of hit rate and {100 * time:.1f}% "
            "of duration")


def _roofline_by_sms() -> str:
    by = _sms()[0]["roofline_copy_gbps_by_sms"]
    whole = _sms()[0]["roofline_copy_gbps"]
    found = {132: whole, **{int(k): v for k, v in by.items()}}
    return ", ".join(f"{found[s]:,.0f} GB/s on {s} SMs" for s in sorted(found, reverse=True))


def _prefetch_hit(kernel, models=None) -> str:
    """ncu's headline hit rate with bulk K+V d=1 over every SM count (counters_sms.json)."""
    return _range([b["l2_hit_pct"] for sms in (132, 80, 32)
                   for _, b in _pairs(kernel, sms, models)], "{:.1f}", "%")


def _none_hit(kernel, models=None) -> str:
    return _range([n["l2_hit_pct"] for sms in (132, 80, 32)
                   for n, _ in _pairs(kernel, sms, models)], "{:.1f}", "%")


def _provenance(name: str) -> str:
    from .common import source

    return source("h200", name)


_MHA = ("llama2-7b",)


BLOCKS.update({
    "counters.source-counters": lambda: _provenance("counters"),
    "counters.source-counters-sms": lambda: _provenance("counters_sms"),
    "counters.source-attention-sms": lambda: _provenance("attention_sms"),
    "counters.rooflines": _roofline_by_sms,
    "counters.gain": lambda: f"{GAIN:.2f}x",
    "counters.ncu": lambda: load_result("h200", "counters")["ncu"].split(" (")[0],
    "counters.v1-132-median": lambda: _median_x("vllm_v1", 132),
    "counters.v1-80-median": lambda: _median_x("vllm_v1", 80),
    "counters.v1-32-median": lambda: _median_x("vllm_v1", 32),
    "counters.gqa-132-median": lambda: _median_x("gqa", 132),
    "counters.v1-132-range": lambda: _range(_speedups("vllm_v1", 132), "{:.2f}", "x"),
    "counters.v1-80-range": lambda: _range(_speedups("vllm_v1", 80), "{:.2f}", "x"),
    "counters.v1-32-range": lambda: _range(_speedups("vllm_v1", 32), "{:.2f}", "x"),
    "counters.v1-80-above": lambda: _above("vllm_v1", 80),
    "counters.v1-32-above": lambda: _above("vllm_v1", 32),
    "counters.v1-132-above": lambda: _above("vllm_v1", 132),
    "counters.v1-132-gains": _gains_at_132,
    "counters.v1-32-stall": lambda: _counter_median("vllm_v1", 32, "long_scoreboard_cycles"),
    "counters.v1-80-stall": lambda: _counter_median("vllm_v1", 80, "long_scoreboard_cycles"),
    "counters.v1-132-stall": lambda: _counter_median("vllm_v1", 132, "long_scoreboard_cycles"),
    "counters.v1-132-hit": lambda: _counter_median("vllm_v1", 132, "l2_hit_pct", 0, "%"),
    "counters.v1-32-dram": lambda: _dram_none("vllm_v1", 32),
    "counters.v1-mha-132-dram": lambda: _dram_none("vllm_v1", 132, _MHA),
    "counters.v1-gqa-132-dram": lambda: _dram_none("vllm_v1", 132, _gqa_models()),
    "counters.v1-gqa-reread": lambda: _reread("vllm_v1", 132, _gqa_models()),
    "counters.v1-gqa-132-memory-none": lambda: _column_range(
        "vllm_v1", 132, "memory_throughput_pct", 0, _gqa_models()),
    "counters.v1-gqa-132-memory-bulk": lambda: _column_range(
        "vllm_v1", 132, "memory_throughput_pct", 1, _gqa_models()),
    "counters.v1-gqa-132-dram-bulk": lambda: _column_range(
        "vllm_v1", 132, "dram_throughput_pct", 1, _gqa_models()),
    "counters.v1-mha-hit-none": lambda: _none_hit("vllm_v1", _MHA),
    "counters.v1-mha-hit-bulk": lambda: _prefetch_hit("vllm_v1", _MHA),
    "counters.gqa-132-range": lambda: _range(_speedups("gqa", 132), "{:.2f}", "x"),
    "counters.gqa-80-range": lambda: _range(_speedups("gqa", 80), "{:.2f}", "x"),
    "counters.gqa-32-range": lambda: _range(_speedups("gqa", 32), "{:.2f}", "x"),
    "counters.gqa-reread": lambda: _range([n["l2_read_bytes"] / n["dram_read_bytes"]
                                           for s in (132, 80, 32)
                                           for n, _ in _pairs("gqa", s)], "{:.3f}", ""),
    "counters.gqa-hit-none": lambda: _none_hit("gqa"),
    "counters.gqa-hit-bulk": lambda: _prefetch_hit("gqa"),
    "counters.gqa-132-dram": lambda: _dram_none("gqa", 132),
    "counters.gqa-dram-drop": lambda: "; ".join(
        f"{_counter_median('gqa', s, 'dram_throughput_pct', 0, '%')} on {s} SMs"
        for s in (132, 80, 32)),
    "counters.gqa-stall": lambda: "; ".join(
        f"{_counter_median('gqa', s, 'long_scoreboard_cycles')} on {s} SMs"
        for s in (132, 80, 32)),
    "counters.v1-gqa-stall-table": lambda: _table_point(
        "vllm_v1", "long_scoreboard_cycles", _gqa_models(), 0),
    "counters.v1-gqa-cpi-table": lambda: _table_point("vllm_v1", "cpi", _gqa_models(), 0),
    "counters.h20-gqa-stall": lambda: " → ".join(
        _h20("long_scoreboard_cycles", _gqa_models(), i) for i in (0, 1)),
    "counters.h20-gqa-cpi": lambda: " → ".join(_h20("cpi", _gqa_models(), i) for i in (0, 1)),
    "counters.h20-memory": lambda: _h20("memory_throughput_pct", _paper_models(), 0) + "%",
    "counters.v1-mha-stall-table": lambda: _table_point(
        "vllm_v1", "long_scoreboard_cycles", _MHA, 0),
    "counters.h20-mha-stall": lambda: _h20("long_scoreboard_cycles", _MHA, 0),
    "counters.v1-table-speedups": lambda: _ncu_speedups("vllm_v1"),
    "counters.gqa-table-speedups": lambda: _ncu_speedups("gqa"),
    "counters.over-100": _over_100,
    "counters.over-100-where": _over_100_where,
    "counters.whole-vs-green": _whole_vs_green,
})
