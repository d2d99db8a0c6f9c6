"""gqa on batches of mixed lengths (results/h200/attention_mixed.json), and such a step CTA by
CTA (results/h200/timeline_mixed.json).
"""

from __future__ import annotations

from kvlab.results import load_result
from kvlab.workload import mixed_spec

from .common import heads, loops, pct_range, source
from .small import MIXED_TARGET, outcomes

# Mixed-length points of benchmarks/README.md's table: (batch, lengths spec).
MIXED_POINTS = [(16, "lognormal:3200,16384"), (64, "lognormal:3200,16384"),
                (256, "lognormal:3200,32768"), (64, "lognormal:1536,2048"),
                (256, "lognormal:1536,2048")]


def spec_label(batch: int, spec: str) -> str:
    """A batch of a lengths spec: "64 x ~3.1k (max 16k)" by a lognormal spec's mean and clip,
    "64 x production mix (max 32k)" for FlashInfer's mix scaled to its longest."""
    kind, numbers = mixed_spec(spec)
    if kind == "production":
        return f"{batch} x production mix (max {numbers[0] // 1024}k)"
    mean, longest = numbers
    return f"{batch} x ~{mean / 1024:.1f}k (max {longest // 1024}k)"


def mixed_table(result: dict, points=MIXED_POINTS) -> list[str]:
    """gqa on batches of mixed lengths (results/h200/attention_mixed.json), per model and point:
    its % of the copy roofline, and its speed over the same kernel with the split planned for the
    longest sequence (kernel "gqa_split_longest", same loop); vllm_v1's % and a plain read's of
    the batch's bytes beside."""
    def rows(model, batch, spec):
        return {r["kernel"]: r for r in result["rows"]
                if (r["model"], r["batch"], r.get("lengths")) == (model, batch, spec)}

    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    lines = ["| model (q:kv) | " + " | ".join(spec_label(b, s) for b, s in points) + " |",
             "|---|" + "---|" * len(points)]
    for model in models:
        cells = []
        for batch, spec in points:
            r = rows(model, batch, spec)
            gain = r["gqa_split_longest"]["ms"] / r["gqa"]["ms"]
            cells.append(f"{r['gqa']['pct_roofline']:.1f}% ({gain:.2f}x; vllm_v1 "
                         f"{r['vllm_v1']['pct_roofline']:.0f}%; read "
                         f"{r['read']['pct_roofline']:.0f}%)")
        lines.append(f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |")
    return lines



def planner_table(result: dict) -> list[str]:
    """Per batch and lengths spec (results/h200/attention_mixed.json), over the models: the
    batch's mean and longest length as drawn, gqa's % of the copy roofline split by the lengths
    and planned for the longest sequence, the speed ratio, and its wins, ties and losses."""
    timed = loops(result)
    lines = ["| batch, spec | drawn: mean / longest | gqa, % of the roofline | planned for the "
             "longest | by the lengths over for the longest |", "|---|---|---|---|---|"]
    for batch, spec in dict.fromkeys((b, s) for _, b, _, s in timed):
        pts = [p for (_, b, _, s), p in timed.items() if (b, s) == (batch, spec)]
        first = pts[0]["gqa"]
        gain = [p["gqa_split_longest"]["ms"] / p["gqa"]["ms"] for p in pts]
        lines.append(
            f"| {spec_label(batch, spec)} | {first['context']} / {first['max_context']} | "
            f"{pct_range([p['gqa']['pct_roofline'] for p in pts])} | "
            f"{pct_range([p['gqa_split_longest']['pct_roofline'] for p in pts])} | "
            f"{min(gain):.2f}-{max(gain):.2f}x ("
            f"{outcomes((p['gqa']['ms_runs'], p['gqa_split_longest']['ms_runs']) for p in pts)}) |")
    return lines


def misses(result: dict) -> list[str]:
    """The loops of results/h200/attention_mixed.json where gqa is under MIXED_TARGET: gqa's and
    the read's % of the copy roofline and gqa's speed over the read's."""
    lines = ["| model (q:kv) | batch, spec | gqa | read | gqa / read |", "|---|---|---|---|---|"]
    for (model, batch, _, spec), p in loops(result).items():
        g, r = p["gqa"], p["read"]
        if g["pct_roofline"] < MIXED_TARGET:
            lines.append(f"| {model} ({heads(model)}) | {spec_label(batch, spec)} | "
                         f"{g['pct_roofline']:.1f}% | {r['pct_roofline']:.1f}% | "
                         f"{r['ms'] / g['ms']:.2f}x |")
    return lines


def read_passes(result: dict) -> str:
    """Where gqa misses MIXED_TARGET and the read in its loop does not: gqa's speed over the
    read's, and the same over every loop of 64 or more sequences."""
    timed = loops(result)
    own = [p["read"]["ms"] / p["gqa"]["ms"] for p in timed.values()
           if p["gqa"]["pct_roofline"] < MIXED_TARGET <= p["read"]["pct_roofline"]]
    big = [p["read"]["ms"] / p["gqa"]["ms"] for (_, b, _, _), p in timed.items() if b >= 64]
    return (f"{min(own):.2f}-{max(own):.2f}x of the read's speed, against "
            f"{min(big):.2f}-{max(big):.2f}x at 64 sequences or more")


def one_wave(result: dict, timeline: dict, model: str = "qwen2.5-7b", batch: int = 64,
             spec: str = "lognormal:1536,2048") -> str:
    """The one-wave point: its decode CTAs (timeline_mixed.json, the same lengths), the GPU's two
    slots an SM, and gqa's % and speed over the read's (attention_mixed.json)."""
    p = loops(result)[next(k for k in loops(result) if (k[0], k[1], k[3]) == (model, batch,
                                                                              spec))]
    row = next(r for r in timeline["rows"] if (r["model"], r["batch"], r.get("lengths")) == (
        model, batch, spec))
    return (f"{model}'s {spec_label(batch, spec)} runs {row['phases']['decode_ctas']} CTAs, "
            f"fewer than the {2 * result['num_sms']} slots of two CTAs an SM: one wave, whose "
            f"longest CTAs end alone ({p['gqa']['pct_roofline']:.1f}% of the roofline, "
            f"{p['read']['ms'] / p['gqa']['ms']:.2f}x the read's speed)")


def _traced(timeline: dict, batch: int, split: bool = True) -> list[dict]:
    return [r for r in timeline["rows"] if r["batch"] == batch
            and (r["phases"].get("merge_end_after_us") is not None) == split]


def traced(timeline: dict, batch: int) -> str:
    """The split batches of `batch` sequences (results/h200/timeline_mixed.json): gqa's timed
    median beyond the read's, the merge's CTAs and its end after the decode launch, the decode
    launch's span beyond the read's, and the share of merge CTAs that start only after the decode
    launch's last CTA has ended (in the recorded trace: the traced step of median span)."""
    rows = _traced(timeline, batch)

    def us(values, digits=1):
        lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
        return f"{lo} us" if lo == hi else f"{lo}-{hi} us"

    late = {}
    for r in rows:
        trace = r["trace"]
        last = max(trace["decode"]["end"])
        late[r["model"]] = 100 * sum(t > last for t in trace["merge"]["entry"]) / len(
            trace["merge"]["entry"])
    late_text = ("none of the merge's CTAs starts after the decode launch has ended"
                 if not any(late.values()) else
                 "of the merge's CTAs, " + ", ".join(f"{share:.0f}% on {model}" for model, share
                                                     in late.items()) +
                 " start after the decode launch has ended")
    beyond = [1000 * (r["ms"]["gqa"] - r["ms"]["read"]) for r in rows]
    return (f"at the {len(rows)} split batches, gqa's timed median is {us(beyond)} "
            f"beyond the read's; the merge ({min(r['phases']['merge_ctas'] for r in rows)}-"
            f"{max(r['phases']['merge_ctas'] for r in rows)} CTAs, a split sequence and query head "
            f"each) ends {us([r['phases']['merge_end_after_us'] for r in rows])} after the decode "
            f"launch's last CTA, and the decode launch spans "
            f"{us([r['phases']['decode_span_us'] - r['phases']['read_span_us'] for r in rows])} "
            f"more than the read; {late_text}")


BLOCKS = {
    "mixed.source": lambda: source("h200", "attention_mixed"),
    "mixed.source-timeline": lambda: source("h200", "timeline_mixed"),
    "mixed.target": lambda: f"{MIXED_TARGET:.0f}%",
    "mixed.planner": lambda: planner_table(load_result("h200", "attention_mixed")),
    "mixed.misses": lambda: misses(load_result("h200", "attention_mixed")),
    "mixed.read-passes": lambda: read_passes(load_result("h200", "attention_mixed")),
    "mixed.one-wave": lambda: one_wave(load_result("h200", "attention_mixed"),
                                       load_result("h200", "timeline_mixed")),
    "mixed.traced-64": lambda: traced(load_result("h200", "timeline_mixed"), 64),
    "mixed.traced-16": lambda: traced(load_result("h200", "timeline_mixed"), 16),
    "mixed.table": lambda: mixed_table(load_result("h200", "attention_mixed")),
}
