"""gqa on an fp8 KV cache against fp16 (results/h200/attention_fp8.json) and against bf16 with a
bf16 q (results/h200/attention_bf16.json).
"""

from __future__ import annotations

from kvlab.bench.stats import versus
from kvlab.results import load_result

from .common import context_label, heads, loops, pct_range, source
from .small import outcomes

# gqa on fp8 against fp16: the points of benchmarks/README.md's table, (batch, context).
FP8_POINTS = [(1, 32768), (16, 1024), (16, 32768), (64, 4096), (64, 32768)]
FP8_LARGE_TOKENS = 512 * 1024  # "large shapes": batch x context from here
FP8_TARGET = 1.8  # fp8 at least this times fp16's tokens/s at the large shapes


def fp8_table(result: dict, points=FP8_POINTS) -> list[str]:
    """gqa on an fp8 cache against the same shape on fp16, one loop per point
    (results/h200/attention_fp8.json): the fp16 time over the fp8 time (the tokens/s ratio) and
    fp8's % of the copy roofline (of the fp8 bytes it reads); then the range of the ratio over
    the large shapes (batch x context >= FP8_LARGE_TOKENS). A ratio within the run-to-run spread
    (kvlab.bench.stats) is marked a tie."""
    def pair(model, batch, context):
        rows = {r["kernel"]: r for r in result["rows"] if r["prefetch"] == "none" and (
            r["model"], r["batch"], r["context"]) == (model, batch, context)}
        return rows["gqa"]["ms"] / rows["gqa_fp8"]["ms"], rows["gqa_fp8"]["pct_roofline"]

    def tied(model, batch, context):
        rows = {r["kernel"]: r for r in result["rows"] if r["prefetch"] == "none" and (
            r["model"], r["batch"], r["context"]) == (model, batch, context)}
        return versus(rows["gqa_fp8"]["ms_runs"], rows["gqa"]["ms_runs"]) == "tie"

    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {context_label(c)}" for b, c in points)
             + " |",
             "|---|" + "---|" * len(points)]
    for model in models:
        cells = [f"{ratio:.2f}x{', a tie' if tie else ''} ({pct:.0f}%)"
                 for ratio, pct, tie in (pair(model, b, c) + (tied(model, b, c),)
                                         for b, c in points)]
        lines.append(f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |")
    large = [pair(r["model"], r["batch"], r["context"])[0] for r in result["rows"]
             if r["kernel"] == "gqa_fp8" and r["prefetch"] == "none"
             and r["batch"] * r["context"] >= FP8_LARGE_TOKENS]
    lines.append(f"From {FP8_LARGE_TOKENS // 1024}k tokens ({len(large)} points): "
                 f"{min(large):.2f}-{max(large):.2f}x.")
    return lines



def _pairs(result: dict, keep=lambda key: True) -> list[tuple]:
    """(point, fp16 row, fp8 row) of each loop of `result` that `keep` accepts."""
    return [(key, p["gqa"], p["gqa_fp8"]) for key, p in loops(
        result, lambda r: r["prefetch"] == "none").items() if keep(key)]


def large(result: dict) -> str:
    """From FP8_LARGE_TOKENS: the points at FP8_TARGET or more, the ratio's range and fp8's % of
    the copy roofline."""
    pairs = _pairs(result, lambda k: k[1] * k[2] >= FP8_LARGE_TOKENS)
    ratios = [g["ms"] / f["ms"] for _, g, f in pairs]
    return (f"{sum(x >= FP8_TARGET for x in ratios)} of {len(ratios)} points from "
            f"{FP8_LARGE_TOKENS // 1024}k tokens, at {min(ratios):.2f}-{max(ratios):.2f}x, fp8 "
            f"reading {pct_range([f['pct_roofline'] for _, _, f in pairs])} of the roofline")


def at_tokens(result: dict, tokens: int) -> str:
    """fp8 over fp16 at the points of `tokens` (batch x context): the ratio's range."""
    pairs = _pairs(result, lambda k: k[1] * k[2] == tokens)
    ratios = [g["ms"] / f["ms"] for _, g, f in pairs]
    return f"{min(ratios):.2f}-{max(ratios):.2f}x"


def one_sequence(result: dict, context: int = 32768) -> str:
    """fp8's % of the copy roofline at 1 x `context`, over the models."""
    return pct_range([f["pct_roofline"] for _, _, f in _pairs(result, lambda k: k[1:3] == (
        1, context))])


def ties(result: dict) -> str:
    """The points where fp8 and fp16 tie (kvlab.bench.stats), by model."""
    tied = [key for key, g, f in _pairs(result) if versus(f["ms_runs"], g["ms_runs"]) == "tie"]
    by_model = {}
    for model, batch, context, _ in tied:
        by_model.setdefault(model, []).append(f"{batch} x {context_label(context)}")
    return (f"{len(tied)} of {len(_pairs(result))} points: "
            + "; ".join(f"{model} {', '.join(points)}" for model, points in by_model.items()))


def bf16_table(result: dict) -> list[str]:
    """gqa with q, out and the 16-bit cache in bf16 against gqa on fp8 and SDPA on bf16, one loop
    per point (results/h200/attention_bf16.json): fp8's speed over bf16's (its % of the copy
    roofline), and gqa's over SDPA's on bf16, each with its outcome (kvlab.bench.stats)."""
    timed = loops(result)
    points = list(dict.fromkeys((b, c) for _, b, c, _ in timed))
    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {context_label(c)}" for b, c in points)
             + " |", "|---|" + "---|" * len(points)]
    for model in dict.fromkeys(k[0] for k in timed):
        cells = []
        for b, c in points:
            p = timed[(model, b, c, None)]
            g, f, sdpa = p["gqa"], p["gqa_fp8"], p["sdpa"]
            cells.append(f"fp8 {g['ms'] / f['ms']:.2f}x, {versus(f['ms_runs'], g['ms_runs'])} "
                         f"({f['pct_roofline']:.0f}%); bf16 {sdpa['ms'] / g['ms']:.3f}x SDPA, "
                         f"{versus(g['ms_runs'], sdpa['ms_runs'])}")
        lines.append(f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |")
    return lines


def bf16_sdpa(result: dict) -> str:
    """gqa on bf16 against SDPA on bf16: the ratio's range and the wins, ties and losses."""
    pts = list(loops(result).values())
    ratios = [p["sdpa"]["ms"] / p["gqa"]["ms"] for p in pts]
    return (f"{min(ratios):.2f}-{max(ratios):.2f}x SDPA's speed on bf16 ("
            f"{outcomes((p['gqa']['ms_runs'], p['sdpa']['ms_runs']) for p in pts)})")


def q_dtype(fp16: dict, bf16: dict, batch: int = 1, context: int = 32768) -> str:
    """fp8's speedup at batch x context with an fp16 q (attention_fp8.json) and a bf16 q
    (attention_bf16.json), per model of the bf16 recording."""
    def ratio(result, model):
        p = loops(result)[(model, batch, context, None)]
        return p["gqa"]["ms"] / p["gqa_fp8"]["ms"]

    models = dict.fromkeys(r["model"] for r in bf16["rows"])
    return "; ".join(f"{m} {ratio(fp16, m):.2f}x with an fp16 q, {ratio(bf16, m):.2f}x with a "
                     f"bf16 q" for m in models)


BLOCKS = {
    "fp8.source": lambda: source("h200", "attention_fp8"),
    "fp8.source-bf16": lambda: source("h200", "attention_bf16"),
    "fp8.target": lambda: f"{FP8_TARGET}x",
    "fp8.large": lambda: large(load_result("h200", "attention_fp8")),
    "fp8.at-256k": lambda: at_tokens(load_result("h200", "attention_fp8"), 256 * 1024),
    "fp8.one-sequence": lambda: one_sequence(load_result("h200", "attention_fp8")),
    "fp8.ties": lambda: ties(load_result("h200", "attention_fp8")),
    "fp8.bf16-table": lambda: bf16_table(load_result("h200", "attention_bf16")),
    "fp8.bf16-sdpa": lambda: bf16_sdpa(load_result("h200", "attention_bf16")),
    "fp8.q-dtype": lambda: q_dtype(load_result("h200", "attention_fp8"),
                                   load_result("h200", "attention_bf16")),
    "fp8.table": lambda: fp8_table(load_result("h200", "attention_fp8")),
}
