"""Small steps (results/h200/attention_small.json, attention_read.json, attention_block_order.json,
timeline*.json): gqa against a plain read of the same bytes, blocks in order, where a step's
time goes, and the targets on the copy roofline.
"""

from __future__ import annotations

import statistics

from kvlab.bench.stats import tally
from kvlab.results import load_result

from .common import context_label, heads, loops, pct_range, source, spread

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

    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {context_label(c)}" for b, c in points)
             + " |",
             "|---|" + "---|" * len(points)]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        cells = []
        for batch, context in points:
            gqa, sdpa, read = (row(model, batch, context, k) for k in ("gqa", "sdpa", "read"))
            cells.append(f"{gqa['pct_roofline']:.1f}% ({sdpa['ms'] / gqa['ms']:.3f}x SDPA; "
                         f"read {read['pct_roofline']:.1f}%)")
        lines.append(f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |")
    return lines


# From this many tokens (batch x context) a point counts as large in block_order_table and
# read_table.
LARGE_TOKENS = 256 * 1024


def read_table(result: dict) -> list[str]:
    """gqa (no prefetch) and SDPA against a plain read of the same bytes, one loop per point
    (results/h200/attention_read.json), per model, below and from LARGE_TOKENS: the read's % of
    the copy roofline, and the range and median of each kernel's speed over the read's."""
    timed = loops(result)
    lines = ["| model (q:kv) | points | read: % of the roofline | gqa / read | SDPA / read |",
             "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        for large in (False, True):
            points = [p for (m, batch, context, _), p in timed.items()
                      if m == model and (batch * context >= LARGE_TOKENS) == large]
            read = [p["read"]["pct_roofline"] for p in points]
            over = {k: [p["read"]["ms"] / p[k]["ms"] for p in points] for k in ("gqa", "sdpa")}
            lines.append(f"| {model} ({heads(model)}) | {len(points)} "
                         f"{'from' if large else 'below'} {LARGE_TOKENS // 1024}k tokens | "
                         f"{min(read):.1f}-{max(read):.1f}% | {spread(over['gqa'])} | "
                         f"{spread(over['sdpa'])} |")
    return lines


def outcomes(pairs) -> str:
    """"5 wins, 4 ties, 5 losses" over (runs, baseline_runs) pairs (kvlab.bench.stats: a tie
    where the two rows' interquartile ranges overlap)."""
    counts = tally(pairs)
    return ", ".join(f"{n} {word if n == 1 else word + ('es' if word == 'loss' else 's')}"
                     for word, n in counts.items())


def block_order_table(result: dict) -> list[str]:
    """Each family without prefetch on blocks in order against scattered blocks, and gqa against
    SDPA either way, one loop per point (results/h200/attention_block_order.json), per model:
    the range and median of the speed ratios; against SDPA, gqa's wins, ties and losses
    (kvlab.bench.stats) and the median ratio over the large points (batch x context >=
    LARGE_TOKENS)."""
    timed = loops(result)

    def against_sdpa(points, kernel):
        large = [p["sdpa"]["ms"] / p[kernel]["ms"] for tokens, p in points
                 if tokens >= LARGE_TOKENS]
        return (f"{outcomes((p[kernel]['ms_runs'], p['sdpa']['ms_runs']) for _, p in points)} "
                f"(large: median {statistics.median(large):.3f}x)")

    lines = ["| model (q:kv) | gqa, in order / scattered | vllm_v1, in order / scattered | "
             "gqa against SDPA, scattered | gqa against SDPA, in order |",
             "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in result["rows"]):
        points = [(batch * context, p) for (m, batch, context, _), p in timed.items()
                  if m == model]
        gain = {f: [p[f]["ms"] / p[f"{f}_in_order"]["ms"] for _, p in points]
                for f in ("gqa", "vllm_v1")}
        lines.append(f"| {model} ({heads(model)}) | {spread(gain['gqa'])} | "
                     f"{spread(gain['vllm_v1'])} | {against_sdpa(points, 'gqa')} | "
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
                 if "lengths" in r else f"{r['batch']} x {context_label(r['context'])}")
        lines.append(
            f"| {r['model']} ({heads(r['model'])}) | {point} | "
            f"{p['decode_ctas']} | {ms['gqa'] * 1000:.1f} / {ms['read'] * 1000:.1f} | "
            f"{p['step_span_us']:.1f} / {p['decode_span_us']:.1f} / {p['read_span_us']:.1f} | "
            f"{p['ready_us']:.2f} / {p['issued_us']:.2f} / {p['landed_us']:.2f} | "
            f"{p['epilogue_us']:.2f} | {'-' if merge is None else f'{merge:.2f}'} |")
    return lines


# The decode kernels' targets against the copy roofline: (batch, context) -> % at least, in
# results/h200/attention_small.json; every batch of results/h200/attention_mixed.json at least
# MIXED_TARGET.
SMALL_TARGETS = {(1, 32768): 80.0, (16, 1024): 70.0}


MIXED_TARGET = 85.0


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
            cells = [f"{len(met)} of {len(mine)}" + (f": {pct_range(met)}" if met else "")]
            for read_reaches in (True, False):
                missed = [(g, r) for g, r in mine if g < target and (r >= target) == read_reaches]
                cells.append(f"{len(missed)}: gqa {pct_range([g for g, _ in missed])}, read "
                             f"{pct_range([r for _, r in missed])}" if missed else "-")
            yield f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |"

    lines = ["| target | model (q:kv) | met | missed, where a read reaches the target | missed, "
             "where a read does not |", "|---|---|---|---|---|"]
    for (batch, context), target in SMALL_TARGETS.items():
        points = [(k, p) for k, p in loops(small, no_prefetch).items()
                  if k[1:3] == (batch, context)]
        lines += [f"| {batch} x {context_label(context)} at {target:.0f}% " + line
                  for line in rows(target, points)]
    lines += [f"| mixed lengths at {MIXED_TARGET:.0f}% " + line
              for line in rows(MIXED_TARGET, list(loops(mixed, no_prefetch).items()))]
    return lines



def _us(values, digits=1) -> str:
    """"0.26-0.51 us" or "2.05 us": a range of microseconds."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{lo} us" if lo == hi else f"{lo}-{hi} us"


def small_vs_sdpa(result: dict) -> str:
    """gqa against SDPA at the small points (results/h200/attention_small.json): the range of
    its speed ratio and its wins, ties and losses."""
    points = list(loops(result).values())
    ratios = [p["sdpa"]["ms"] / p["gqa"]["ms"] for p in points]
    return (f"{min(ratios):.3f}-{max(ratios):.3f}x SDPA's speed ("
            f"{outcomes((p['gqa']['ms_runs'], p['sdpa']['ms_runs']) for p in points)})")


def read_smallest(result: dict) -> str:
    """The plain read's % of the copy roofline at its smallest point (fewest bytes) and at
    1 x 8k of the 8-KV-head models (results/h200/attention_read.json)."""
    reads = [r for r in result["rows"] if r["kernel"] == "read"]
    low = min(reads, key=lambda r: r["kv_bytes"])
    at_8k = [r["pct_roofline"] for r in reads if (r["batch"], r["context"]) == (1, 8192)
             and r["model"] in EIGHT_KV_HEADS]
    return (f"{low['model']}'s {low['batch']} x {context_label(low['context'])} "
            f"({low['kv_bytes'] / 2**20:.0f} MiB) reaches {low['pct_roofline']:.1f}% of the "
            f"roofline, the 8-KV-head models' 1 x 8k (32 MiB) {pct_range(at_8k)}")


EIGHT_KV_HEADS = ("llama3-8b", "qwen2.5-14b")


def read_large(result: dict) -> str:
    """From LARGE_TOKENS (results/h200/attention_read.json): the read's % of the roofline, SDPA's
    and gqa's speed over the read's, and gqa against SDPA (ratio, wins, ties, losses)."""
    points = [p for (_, batch, context, _), p in loops(result).items()
              if batch * context >= LARGE_TOKENS]
    read = [p["read"]["pct_roofline"] for p in points]
    over = {k: [p["read"]["ms"] / p[k]["ms"] for p in points] for k in ("sdpa", "gqa")}
    vs = [p["sdpa"]["ms"] / p["gqa"]["ms"] for p in points]
    return (f"the read reaches {pct_range(read)} of the roofline at its {len(points)} points; "
            f"SDPA runs {spread(over['sdpa'])} of the read's speed and gqa "
            f"{spread(over['gqa'])}, so gqa runs {min(vs):.3f}-{max(vs):.3f}x SDPA's speed "
            f"({outcomes((p['gqa']['ms_runs'], p['sdpa']['ms_runs']) for p in points)})")


def read_small(result: dict) -> str:
    """Below LARGE_TOKENS (results/h200/attention_read.json): gqa's and SDPA's speed over the
    read's and gqa against SDPA."""
    points = [p for (_, batch, context, _), p in loops(result).items()
              if batch * context < LARGE_TOKENS]
    over = {k: [p["read"]["ms"] / p[k]["ms"] for p in points] for k in ("gqa", "sdpa")}
    return (f"gqa runs {spread(over['gqa'])} of the read's speed and SDPA "
            f"{spread(over['sdpa'])}; gqa against SDPA at these {len(points)} points: "
            f"{outcomes((p['gqa']['ms_runs'], p['sdpa']['ms_runs']) for p in points)}")


def read_targets(small: dict) -> str:
    """At the target points of SMALL_TARGETS (results/h200/attention_small.json): where the read
    reaches the target, gqa's speed over the read's; where it does not, the read's %."""
    passes, short = [], []
    for (model, batch, context, _), p in loops(small).items():
        target = SMALL_TARGETS.get((batch, context))
        if target is None:
            continue
        if p["read"]["pct_roofline"] >= target:
            passes.append(p["read"]["ms"] / p["gqa"]["ms"])
        else:
            short.append(f"{model} {batch} x {context_label(context)}: read "
                         f"{p['read']['pct_roofline']:.1f}%")
    return (f"where the read reaches the target, gqa runs {min(passes):.2f}-"
            f"{max(passes):.2f}x of the read's speed; where it does not ("
            f"{'; '.join(short)}), the target asks more than reading the bytes")


def targets_across(small: dict, read: dict, grid: dict) -> list[str]:
    """gqa's % of the copy roofline (no prefetch) at SMALL_TARGETS's points in each recording that
    times them, per model: results/h200/attention_small.json, attention_read.json and
    attention.json (the same plans and code, other loops and days)."""
    names = ("attention_small", "attention_read", "attention")
    lines = ["| point, target | model (q:kv) | " + " | ".join(f"`{n}.json`" for n in names) + " |",
             "|---|---|---|---|---|"]
    for (batch, context), target in SMALL_TARGETS.items():
        for model in dict.fromkeys(r["model"] for r in small["rows"]):
            cells = []
            for result in (small, read, grid):
                pct = next(r["pct_roofline"] for r in result["rows"] if r["kernel"] == "gqa"
                           and r["prefetch"] == "none" and (r["model"], r["batch"],
                                                            r["context"]) == (model, batch,
                                                                              context))
                cells.append(f"{pct:.1f}%")
            lines.append(f"| {batch} x {context_label(context)}, {target:.0f}% | {model} "
                         f"({heads(model)}) | " + " | ".join(cells) + " |")
    return lines


def order_worth(result: dict) -> str:
    """Blocks in order against scattered (results/h200/attention_block_order.json), over every
    point: each family's wins, ties and losses."""
    points = list(loops(result).values())
    def against_scattered(family):
        return outcomes((p[f"{family}_in_order"]["ms_runs"], p[family]["ms_runs"])
                        for p in points)

    return "; ".join(f"{family} {against_scattered(family)}" for family in ("gqa", "vllm_v1"))


def order_large(result: dict) -> str:
    """gqa against SDPA from LARGE_TOKENS on the 8-KV-head models, scattered and in order
    (results/h200/attention_block_order.json): the median ratios and the lowest in order."""
    points = [p for (model, batch, context, _), p in loops(result).items()
              if model in EIGHT_KV_HEADS and batch * context >= LARGE_TOKENS]
    ratio = {k: [p["sdpa"]["ms"] / p[k]["ms"] for p in points] for k in ("gqa", "gqa_in_order")}
    return (f"median {statistics.median(ratio['gqa']):.3f}x SDPA's speed scattered, "
            f"{statistics.median(ratio['gqa_in_order']):.3f}x in order, and at least "
            f"{min(ratio['gqa_in_order']):.3f}x at each of their {len(points)} points")


def order_totals(result: dict) -> str:
    """gqa against SDPA over every point (results/h200/attention_block_order.json), scattered and
    in order: wins, ties and losses."""
    points = list(loops(result).values())
    return (f"{outcomes((p['gqa_in_order']['ms_runs'], p['sdpa']['ms_runs']) for p in points)} "
            f"in order and {outcomes((p['gqa']['ms_runs'], p['sdpa']['ms_runs']) for p in points)}"
            f" scattered, over {len(points)} points")


def _phases(result: dict, keep=lambda r: True) -> list[dict]:
    return [dict(r["phases"], row=r) for r in result["rows"] if keep(r)]


def timeline_start(result: dict) -> str:
    """A decode CTA's start (results/h200/timeline.json): when it holds its block ids, has issued
    its first copies, and holds its first tile, by the launch's CTA count."""
    p = _phases(result)
    few = [x["landed_us"] for x in p if x["decode_ctas"] <= 128]
    many = [x["landed_us"] for x in p if x["decode_ctas"] > 128]
    return (f"holds its first block ids and its sequence's length "
            f"{_us([x['ready_us'] for x in p], 2)} after it starts and has issued its first "
            f"copies by "
            f"{_us([x['issued_us'] for x in p], 2)}; its first tile is in shared memory "
            f"{_us(few)} after it starts where a launch has 128 CTAs or fewer, {_us(many)} "
            f"where it has more")


def timeline_merge(result: dict) -> str:
    """The merge of the split points (results/h200/timeline.json): its end after the decode
    launch's last CTA, when its CTAs start, and its wait, first loads and rest."""
    p = [x for x in _phases(result) if x.get("merge_end_after_us") is not None]
    return (f"ends {_us([x['merge_end_after_us'] for x in p])} after the decode launch's last "
            f"CTA at each of the {len(p)} split points. Launched as a programmatic dependent, its "
            f"CTAs start {_us([x['merge_first_entry_us'] for x in p])} into the step and wait; "
            f"the wait returns {_us([x['merge_released_after_us'] for x in p], 2)} after the "
            f"decode launch ends, the first partials take "
            f"{_us([x['merge_loads_us'] for x in p], 2)} to load and the rest "
            f"{_us([x['merge_rest_us'] for x in p], 2)}")


def timeline_beyond(result: dict) -> str:
    """The decode launch's span beyond the read's (results/h200/timeline.json), at the split
    points, at 16 x 1k and 16 x 4k, against a CTA's time after its loop."""
    p = _phases(result)

    def extra(keep):
        return _us([x["decode_span_us"] - x["read_span_us"] for x in p if keep(x["row"])])

    return (f"{extra(lambda r: r['num_partitions'] > 1)} at the split points, "
            f"{extra(lambda r: (r['batch'], r['context']) == (16, 1024))} at 16 x 1k and "
            f"{extra(lambda r: (r['batch'], r['context']) == (16, 4096))} at 16 x 4k, against "
            f"{_us([x['epilogue_us'] for x in p], 2)} a CTA spends after its loop")


def timeline_lone(result: dict) -> str:
    """At 16 x 4k on the 8-KV-head models (lone CTAs; results/h200/timeline.json): a CTA's loop
    against the read's span, and the last CTA's end after the first's, for gqa and the read."""
    p = [x for x in _phases(result) if x["row"]["model"] in EIGHT_KV_HEADS
         and (x["row"]["batch"], x["row"]["context"]) == (16, 4096)]
    return (f"a CTA's loop runs {_us([x['loop_us'] for x in p])} against the read's span of "
            f"{_us([x['read_span_us'] for x in p])}, and the last CTA ends "
            f"{_us([x['decode_span_us'] - x['decode_first_end_us'] for x in p])} after the "
            f"first (the read's {_us([x['read_span_us'] - x['read_first_end_us'] for x in p])} "
            f"after its first)")


def timeline_merge_share(result: dict) -> str:
    """At 1 x 8k (results/h200/timeline.json): the merge's end after the decode launch as a share
    of gqa's timed median beyond the read's."""
    rows = [r for r in result["rows"] if (r["batch"], r["context"]) == (1, 8192)]
    share = [100 * r["phases"]["merge_end_after_us"] / (1000 * (r["ms"]["gqa"] - r["ms"]["read"]))
             for r in rows]
    return (f"{min(share):.0f}-{max(share):.0f}% of what gqa spends beyond the read ("
            f"{_us([r['phases']['merge_end_after_us'] for r in rows])} of "
            f"{_us([1000 * (r['ms']['gqa'] - r['ms']['read']) for r in rows])} timed)")


def timeline_events(result: dict) -> str:
    """What the CUDA events add to a traced span (results/h200/timeline.json), gqa and read."""
    rows = result["rows"]
    return (f"{_us([1000 * r['ms']['gqa'] - r['phases']['step_span_us'] for r in rows])} for gqa, "
            f"{_us([1000 * r['ms']['read'] - r['phases']['read_span_us'] for r in rows])} for the "
            f"read")


BLOCKS = {
    "small.source-small": lambda: source("h200", "attention_small"),
    "small.source-read": lambda: source("h200", "attention_read"),
    "small.source-block-order": lambda: source("h200", "attention_block_order"),
    "small.source-timeline": lambda: source("h200", "timeline"),
    "small.target-1x32k": lambda: f"{SMALL_TARGETS[(1, 32768)]:.0f}%",
    "small.target-16x1k": lambda: f"{SMALL_TARGETS[(16, 1024)]:.0f}%",
    "small.target-mixed": lambda: f"{MIXED_TARGET:.0f}%",
    "small.vs-sdpa": lambda: small_vs_sdpa(load_result("h200", "attention_small")),
    "small.targets-across": lambda: targets_across(load_result("h200", "attention_small"),
                                                   load_result("h200", "attention_read"),
                                                   load_result("h200", "attention")),
    "small.read-targets": lambda: read_targets(load_result("h200", "attention_small")),
    "small.read-smallest": lambda: read_smallest(load_result("h200", "attention_read")),
    "small.read-large": lambda: read_large(load_result("h200", "attention_read")),
    "small.read-small": lambda: read_small(load_result("h200", "attention_read")),
    "small.order-worth": lambda: order_worth(load_result("h200", "attention_block_order")),
    "small.order-large": lambda: order_large(load_result("h200", "attention_block_order")),
    "small.order-totals": lambda: order_totals(load_result("h200", "attention_block_order")),
    "small.timeline-start": lambda: timeline_start(load_result("h200", "timeline")),
    "small.timeline-merge": lambda: timeline_merge(load_result("h200", "timeline")),
    "small.timeline-beyond": lambda: timeline_beyond(load_result("h200", "timeline")),
    "small.timeline-lone": lambda: timeline_lone(load_result("h200", "timeline")),
    "small.timeline-merge-share": lambda: timeline_merge_share(load_result("h200", "timeline")),
    "small.timeline-events": lambda: timeline_events(load_result("h200", "timeline")),
    "small.table": lambda: small_table(load_result("h200", "attention_small")),
    "small.read": lambda: read_table(load_result("h200", "attention_read")),
    "small.block-order": lambda: block_order_table(load_result("h200", "attention_block_order")),
    "small.timeline": lambda: timeline_table(load_result("h200", "timeline")),
    "small.timeline-mixed": lambda: timeline_table(load_result("h200", "timeline_mixed")),
    "small.roofline-targets": lambda: roofline_targets_table(load_result("h200", "attention_small"),
                                                       load_result("h200", "attention_mixed")),
}
