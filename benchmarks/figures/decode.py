"""The decode-attention grid (results/h200/attention.json) and vllm_v1 beside vLLM's own kernels
(attention_vllm.json): the headline table, gqa against SDPA, the paper's prefetch,
kernel="auto", and the targets (docs/decode-attention.md).
"""

from __future__ import annotations

import statistics

from kvlab.bench.stats import tally, versus
from kvlab.results import load_result

from .common import context_label, heads, loops, pct_range, source
from .fp8 import FP8_LARGE_TOKENS, FP8_TARGET
from .small import MIXED_TARGET, SMALL_TARGETS, outcomes

# The decode-attention points of the headline table: (model, batch, context).
DECODE_POINTS = [(model, batch, context) for model in ("llama2-7b", "llama3-8b", "qwen2.5-7b",
                                                       "qwen2.5-14b")
                 for batch, context in ((1, 32768), (16, 1024), (64, 8192))]
# From this many tokens (batch x context) a launch is large enough to keep HBM busy.
LARGE_TOKENS = 256 * 1024
VLLM_WITHIN = 0.07  # the target: vllm_v1 within this fraction of vLLM's own kernels' speed
AUTO_WITHIN = 0.03  # the target: kernel="auto" within this fraction of its family's fastest
AUTO_MODES = {"tuned": "tuned at the point",
              "reused": "tuned at 3/4 of the context, reused at the point",
              "recorded": "`KVLAB_AUTOTUNE=0` (the recorded choice)"}


def _versus_sdpa(result: dict) -> dict:
    """(model, batch, context) -> (gqa row, SDPA row): gqa without prefetch, block 16, and SDPA
    in the same loop."""
    timed = loops(result, lambda r: r["prefetch"] == "none" and r["block_size"] in (16, None)
                  and r["kernel"] in ("gqa", "sdpa"))
    return {key[:3]: (p["gqa"], p["sdpa"]) for key, p in timed.items()}


def _ratio(row: dict, baseline: dict) -> float:
    """`row`'s speed over `baseline`'s."""
    return baseline["ms"] / row["ms"]


def decode_table(result: dict, points=DECODE_POINTS) -> list[str]:
    """Per point (one loop of `python -m kvlab bench attention`): vllm_v1 and its best prefetch
    setting (with its outcome against none, kvlab.bench.stats), gqa and its % of the copy
    roofline, SDPA, and gqa's speed over SDPA's with its outcome."""
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
        gain = ("none" if best is vllm else
                f"{best['prefetch']}, {versus(best['ms_runs'], vllm['ms_runs'])}")
        lines.append(
            f"| {model} ({heads(model)}) | {batch} x {context_label(context)} | "
            f"{vllm['gbps']:,.0f} | {best['gbps']:,.0f} ({_ratio(best, vllm):.2f}x, {gain}) | "
            f"{gqa['gbps']:,.0f} ({gqa['pct_roofline']:.0f}%) | {sdpa['gbps']:,.0f} | "
            f"{_ratio(gqa, sdpa):.3f}, {versus(gqa['ms_runs'], sdpa['ms_runs'])} |")
    return lines


def grid_size(result: dict) -> str:
    """The grid's points: models x batches x contexts, less those skipped (and why)."""
    keys = list(_versus_sdpa(result))

    def listed(values, label=str):
        values = [label(v) for v in sorted(set(values))]
        return ", ".join(values[:-1]) + f" and {values[-1]}"

    skipped = "; ".join(f"{s['model']} {s['batch']} x {context_label(s['context'])}, "
                        f"{s['reason']}" for s in result.get("skipped", []))
    return (f"{len(keys)} points: {len({k[0] for k in keys})} models x batch "
            f"{listed(k[1] for k in keys)} x context {listed((k[2] for k in keys), context_label)}"
            + (f"; left out: {skipped}" if skipped else ""))


def roofline(result: dict) -> str:
    """The copy roofline measured in the recording's process."""
    return f"{result['roofline_copy_gbps']:,.0f} GB/s"


def sdpa_inputs(result: dict) -> str:
    """What SDPA's rows read, from what they record: the kernels' own K/V with the outputs
    compared (rows with `kv_from`), or dense K/V of its own."""
    sdpa = [r for r in result["rows"] if r["kernel"] == "sdpa"]
    if all("kv_from" in r for r in sdpa):
        agree = sum(bool(r.get("outputs_agree")) for r in sdpa)
        return (f"on the K/V the paged kernels read, gathered dense, its output checked against "
                f"theirs (agreeing at {agree} of {len(sdpa)} points)")
    return ("on dense K/V of the same shape filled with random values of its own; its output "
            "was not compared with the kernels'")


def grid_table(result: dict) -> list[str]:
    """gqa (no prefetch, block 16) over the whole grid, per model and batch, per context: its %
    of the copy roofline, its speed over SDPA's in the same loop and the outcome
    (kvlab.bench.stats)."""
    points = _versus_sdpa(result)
    contexts = sorted({c for _, _, c in points})
    lines = ["| model (q:kv) | batch | " + " | ".join(context_label(c) for c in contexts) + " |",
             "|---|---|" + "---|" * len(contexts)]
    for model, batch in dict.fromkeys((m, b) for m, b, _ in points):
        cells = []
        for context in contexts:
            pair = points.get((model, batch, context))
            cells.append("-" if pair is None else
                         f"{pair[0]['pct_roofline']:.1f}% ({_ratio(*pair):.3f}x, "
                         f"{versus(pair[0]['ms_runs'], pair[1]['ms_runs'])})")
        lines.append(f"| {model} ({heads(model)}) | {batch} | " + " | ".join(cells) + " |")
    return lines


def vs_sdpa(result: dict) -> str:
    """gqa against SDPA over the grid: at least SDPA's speed (wins and ties), the ties, the range
    of the ratio; where it loses, the smallest batch and the largest shortfall."""
    pairs = list(_versus_sdpa(result).items())
    counts = tally((g["ms_runs"], s["ms_runs"]) for _, (g, s) in pairs)
    ratios = [_ratio(g, s) for _, (g, s) in pairs]
    lost = [(key, _ratio(g, s)) for key, (g, s) in pairs
            if versus(g["ms_runs"], s["ms_runs"]) == "loss"]
    text = (f"at least SDPA's speed at {counts['win'] + counts['tie']} of {len(pairs)} points "
            f"({counts['tie']} of them ties), at {min(ratios):.3f}-{max(ratios):.3f}x its speed")
    if lost:
        text += (f"; behind it at {len(lost)}, all at batch {min(k[1] for k, _ in lost)} or more, "
                 f"by {1 - max(x for _, x in lost):.1%}-{1 - min(x for _, x in lost):.1%}")
    return text


def batch_one(result: dict) -> str:
    """gqa against SDPA at batch 1: its outcomes and the range of the ratio."""
    pairs = [p for key, p in _versus_sdpa(result).items() if key[1] == 1]
    ratios = [_ratio(*p) for p in pairs]
    return (f"{outcomes((g['ms_runs'], s['ms_runs']) for g, s in pairs)} at "
            f"{min(ratios):.3f}-{max(ratios):.3f}x")


def large(result: dict) -> str:
    """From LARGE_TOKENS: gqa's % of the copy roofline and its speed over SDPA's (range, median,
    outcomes), and SDPA's %."""
    pairs = [p for (_, b, c), p in _versus_sdpa(result).items() if b * c >= LARGE_TOKENS]
    ratios = [_ratio(*p) for p in pairs]
    return (f"at the {len(pairs)} points from {LARGE_TOKENS // 1024}k tokens gqa reads "
            f"{pct_range([g['pct_roofline'] for g, _ in pairs])} of the copy roofline and SDPA "
            f"{pct_range([s['pct_roofline'] for _, s in pairs])}; gqa runs "
            f"{min(ratios):.3f}-{max(ratios):.3f}x SDPA's speed (median "
            f"{statistics.median(ratios):.3f}x; "
            f"{outcomes((g['ms_runs'], s['ms_runs']) for g, s in pairs)})")


def prefetch_table(result: dict) -> list[str]:
    """Each family's prefetch settings against no prefetch in the same loop (block 16), over
    every (point, setting) pair: the ratio's range and median, the outcomes, the wins at batch 1,
    and the largest gain with its point and setting."""
    timed = {}
    for r in result["rows"]:
        if r["kernel"] in ("vllm_v1", "gqa") and r["block_size"] == 16:
            timed.setdefault((r["kernel"], r["model"], r["batch"], r["context"]), {})[
                r["prefetch"]] = r
    lines = ["| family | (point, setting) pairs | speed over none | wins, ties, losses | "
             "wins at batch 1 | largest gain |", "|---|---|---|---|---|---|"]
    for family in ("vllm_v1", "gqa"):
        pairs = [(key, r, p["none"]) for key, p in timed.items() if key[0] == family
                 for s, r in p.items() if s != "none"]
        ratios = [_ratio(r, none) for _, r, none in pairs]
        key, top, none = max(pairs, key=lambda x: _ratio(x[1], x[2]))
        wins = [k for k, r, n in pairs if versus(r["ms_runs"], n["ms_runs"]) == "win"]
        lines.append(f"| `{family}` | {len(pairs)} | {min(ratios):.3f}-{max(ratios):.3f}x "
                     f"(median {statistics.median(ratios):.3f}x) | "
                     f"{outcomes((r['ms_runs'], n['ms_runs']) for _, r, n in pairs)} | "
                     f"{sum(k[2] == 1 for k in wins)} of {len(wins)} | {_ratio(top, none):.3f}x, "
                     f"{key[1]} {key[2]} x {context_label(key[3])}, "
                     f"{top['prefetch']} |")
    return lines


def _auto_rows(result: dict):
    """(auto row, its family's fastest row in the same loop, the row of the setting auto ran)."""
    by_loop = {}
    for r in result["rows"]:
        by_loop.setdefault(r["loop"], []).append(r)
    for mine in by_loop.values():
        for r in mine:
            if r["kernel"] == "auto":
                family = [x for x in mine if x["kernel"] == r["family"]]
                own = next(x for x in family if x["prefetch"] == r["prefetch"])
                yield r, min(family, key=lambda x: x["ms"]), own


def auto_table(result: dict) -> list[str]:
    """kernel="auto" per mode: the worst and median of its time over the fastest setting of its
    family in the same loop, the rows within AUTO_WITHIN of it, and its outcomes against that
    row (kvlab.bench.stats)."""
    found = {}
    for r, best, _ in _auto_rows(result):
        found.setdefault(r["auto_mode"], []).append((r, best))
    lines = [f"| `auto` | worst | median | within {AUTO_WITHIN:.0%} | against the fastest "
             "setting |", "|---|---|---|---|---|"]
    for mode, label in AUTO_MODES.items():
        pairs = found[mode]
        slower = [r["ms"] / best["ms"] for r, best in pairs]
        lines.append(f"| {label} | {max(slower):.3f}x | {statistics.median(slower):.3f}x | "
                     f"{sum(x <= 1 + AUTO_WITHIN for x in slower)} of {len(slower)} | "
                     f"{outcomes((r['ms_runs'], b['ms_runs']) for r, b in pairs)} |")
    return lines


def auto_misses(result: dict) -> str:
    """The auto rows more than AUTO_WITHIN behind their family's fastest setting: whose they are;
    where auto ran that fastest setting itself (the same kernel timed twice in one loop), and
    where it picked another, how far that setting's own row ran behind the fastest."""
    misses = [(r, best, own) for r, best, own in _auto_rows(result)
              if r["ms"] > (1 + AUTO_WITHIN) * best["ms"]]
    if not misses:
        return f"every `auto` row is within {AUTO_WITHIN:.0%} of its family's fastest setting"
    families = sorted({r["family"] for r, _, _ in misses})
    same = [(r, best) for r, best, own in misses if own is best]
    other = [(best, own) for r, best, own in misses if own is not best]

    def where(rows):
        return ", ".join(dict.fromkeys(f"{r['model']} {r['batch']} x {context_label(r['context'])}"
                                       for r in rows))

    text = (f"the {len(misses)} rows past {AUTO_WITHIN:.0%} are all "
            f"{' and '.join(f'`{f}`' for f in families)}'s")
    if same:
        slower = [r["ms"] / best["ms"] for r, best in same]
        text += (f"; {len(same)} ran the fastest setting itself ({where(r for r, _ in same)}) "
                 f"and took {min(slower):.3f}-{max(slower):.3f}x that setting's own time in the "
                 f"same loop")
    if other:
        behind = [own["ms"] / best["ms"] for best, own in other]
        text += (f"; {len(other)} picked a setting whose own row ran "
                 f"{min(behind) - 1:.1%}-{max(behind) - 1:.1%} behind the fastest "
                 f"({where(own for _, own in other)})")
    return text


def _vllm_pairs(attention_vllm: dict) -> dict:
    """(model, batch, context) -> (vllm_v1 row, vllm_own row): no prefetch, the same loop."""
    timed = loops(attention_vllm, lambda r: r["prefetch"] == "none"
                  and r["kernel"] in ("vllm_v1", "vllm_own"))
    return {key[:3]: (p["vllm_v1"], p["vllm_own"]) for key, p in timed.items()
            if "vllm_own" in p}


def _within(pairs) -> int:
    return sum(abs(_ratio(mine, theirs) - 1) <= VLLM_WITHIN for mine, theirs in pairs)


def vllm_table(attention_vllm: dict) -> list[str]:
    """kvlab's vllm_v1 (no prefetch) against vLLM's own kernels timed in the same loop
    (results/h200/attention_vllm.json; vLLM's built from its source by benchmarks/vllm_cubin.sh,
    the "vllm_own" rows), per model and point: kvlab's GB/s / vLLM's (the ratio), vLLM's variant;
    then how many points lie within VLLM_WITHIN, and the outcomes (kvlab.bench.stats)."""
    found = _vllm_pairs(attention_vllm)
    points = list(dict.fromkeys(key[1:] for key in found))
    lines = ["| model (q:kv) | " + " | ".join(f"{b} x {context_label(c)}" for b, c in points)
             + " |", "|---|" + "---|" * len(points)]
    for model in dict.fromkeys(key[0] for key in found):
        cells = [f"{mine['gbps']:,.0f} / {theirs['gbps']:,.0f} ({_ratio(mine, theirs):.3f}x), "
                 f"{theirs['vllm_variant']}"
                 for mine, theirs in (found[model, b, c] for b, c in points)]
        lines.append(f"| {model} ({heads(model)}) | " + " | ".join(cells) + " |")
    ratios = [_ratio(*p) for p in found.values()]
    lines.append(f"Within {VLLM_WITHIN:.0%} of vLLM's kernels: {_within(found.values())} of "
                 f"{len(ratios)} points; range {min(ratios):.3f}-{max(ratios):.3f}x; "
                 f"{outcomes((m['ms_runs'], t['ms_runs']) for m, t in found.values())}.")
    return lines


def vllm_build(attention_vllm: dict) -> str:
    """The cubin of vLLM's kernels the recording launched: vLLM's version, the compiler, the
    architecture, the file and its hash."""
    cubin = attention_vllm["vllm_cubin"]
    build = cubin["build"]
    return (f"vLLM {build['vllm']}'s, compiled by nvcc {build['nvcc'].split(',')[0]} for "
            f"{build['arch']} with vLLM's flags (`{cubin['file']}`, sha256 "
            f"`{cubin['sha256'][:12]}...`)")


def vllm_tree(attention_vllm: dict) -> str:
    """Whether the recording's code was a commit: `git_dirty` and `git_revision`."""
    revision = attention_vllm.get("git_revision", "")[:7] or "no recorded revision"
    if attention_vllm.get("git_dirty"):
        return (f"from a tree with uncommitted changes on top of {revision} (`git_dirty`), so "
                f"no commit holds exactly the code it timed")
    return f"from committed code, {revision}"


def targets_table(grid, small, mixed, fp8, attention_vllm) -> list[str]:
    """Every decode-kernel target, each against its recording: the points that meet it and where
    its details are."""
    def pct_met(result, target, keep=lambda key: True):
        timed = [p["gqa"]["pct_roofline"] for key, p in loops(
            result, lambda r: r["prefetch"] == "none").items() if keep(key)]
        return f"{sum(x >= target for x in timed)} of {len(timed)}"

    sdpa = tally((g["ms_runs"], s["ms_runs"]) for g, s in _versus_sdpa(grid).values())
    fp8_pairs = [p["gqa"]["ms"] / p["gqa_fp8"]["ms"] for (_, b, c, _), p in loops(
        fp8, lambda r: r["prefetch"] == "none").items() if b * c >= FP8_LARGE_TOKENS]
    vllm = _vllm_pairs(attention_vllm).values()
    auto = {}
    for r, best, _ in _auto_rows(grid):
        auto.setdefault(r["auto_mode"], []).append(r["ms"] <= (1 + AUTO_WITHIN) * best["ms"])
    lines = ["| target | recording | met | details |", "|---|---|---|---|"]
    for (batch, context), target in SMALL_TARGETS.items():
        lines.append(f"| `gqa` at {target:.0f}% of the copy roofline at {batch} x "
                     f"{context_label(context)} | `attention_small.json` | "
                     f"{pct_met(small, target, lambda k, b=batch, c=context: k[1:3] == (b, c))} "
                     f"| [small steps](small-steps.md#the-targets) |")
    lines += [f"| `gqa` at {MIXED_TARGET:.0f}% on batches of mixed lengths | "
              f"`attention_mixed.json` | {pct_met(mixed, MIXED_TARGET)} | "
              f"[mixed lengths](mixed-lengths.md#the-target) |",
              f"| `gqa` at least SDPA's speed | `attention.json` | "
              f"{sdpa['win'] + sdpa['tie']} of {sum(sdpa.values())} ({sdpa['tie']} of them ties) "
              f"| [above](#gqa-against-sdpa) |",
              f"| `gqa` on fp8 at {FP8_TARGET}x fp16's tokens/s, from "
              f"{FP8_LARGE_TOKENS // 1024}k tokens | `attention_fp8.json` | "
              f"{sum(x >= FP8_TARGET for x in fp8_pairs)} of {len(fp8_pairs)} | "
              f"[fp8](fp8.md#fp8-against-fp16) |",
              f"| `vllm_v1` within {VLLM_WITHIN:.0%} of vLLM's own kernels | "
              f"`attention_vllm.json` | {_within(vllm)} of {len(vllm)} | "
              f"[above](#vllm_v1-against-vllms-own-kernels) |",
              f"| `kernel=\"auto\"` within {AUTO_WITHIN:.0%} of its family's fastest setting | "
              f"`attention.json` | " + "; ".join(
                  f"{sum(v)} of {len(v)} {mode}" for mode, v in auto.items()) +
              " | [above](#kernelauto) |"]
    return lines


# The results ratio_targets_table reads, in its arguments' order.
RATIO_TARGET_RESULTS = ("attention", "attention_fp8", "attention_vllm")


def ratio_targets_table(grid: dict, fp8: dict, attention_vllm: dict) -> list[str]:
    """The decode kernels' targets on speed ratios, per model: gqa (no prefetch) at least SDPA's
    speed (a win or a tie, kvlab.bench.stats) at every point of results/h200/attention.json;
    gqa on fp8 at least FP8_TARGET x fp16's tokens/s from FP8_LARGE_TOKENS
    (results/h200/attention_fp8.json); vllm_v1 within VLLM_WITHIN of vLLM's own kernels in the
    same loop (results/h200/attention_vllm.json). A cell: the points that meet it (the ties among
    them, for the first), and the range of the ratio over all of them."""
    def pairs(result, over, under, keep=lambda r: True):
        timed = loops(result, lambda r: r["prefetch"] == "none" and r["block_size"] in (16, None)
                      and keep(r))
        return {key[:3]: (p[under], p[over]) for key, p in timed.items()}

    targets = [
        ("gqa at least SDPA's speed", pairs(grid, "sdpa", "gqa"),
         lambda r, b: versus(r["ms_runs"], b["ms_runs"]) != "loss"),
        (f"fp8 at least {FP8_TARGET}x fp16's tokens/s, from {FP8_LARGE_TOKENS // 1024}k tokens",
         pairs(fp8, "gqa", "gqa_fp8", lambda r: r["batch"] * r["context"] >= FP8_LARGE_TOKENS),
         lambda r, b: _ratio(r, b) >= FP8_TARGET),
        (f"vllm_v1 within {VLLM_WITHIN:.0%} of vLLM's own",
         pairs(attention_vllm, "vllm_own", "vllm_v1"),
         lambda r, b: abs(_ratio(r, b) - 1) <= VLLM_WITHIN)]
    models = list(dict.fromkeys(key[0] for key in targets[2][1]))
    lines = ["| target | " + " | ".join(f"{m} ({heads(m)})" for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for i, (name, found, meets) in enumerate(targets):
        cells = []
        for model in models:
            mine = [p for key, p in found.items() if key[0] == model]
            ratios = [_ratio(*p) for p in mine]
            ties = sum(versus(r["ms_runs"], b["ms_runs"]) == "tie" for r, b in mine)
            cells.append(f"{sum(meets(*p) for p in mine)} of {len(mine)} "
                         + (f"({ties} ties; " if i == 0 else "(")
                         + f"{min(ratios):.3f}-{max(ratios):.3f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _grid():
    return load_result("h200", "attention")


def _vllm():
    return load_result("h200", "attention_vllm")


BLOCKS = {
    "decode.source-grid": lambda: source("h200", "attention"),
    "decode.source-vllm": lambda: source("h200", "attention_vllm"),
    "decode.roofline": lambda: roofline(_grid()),
    "decode.grid-size": lambda: grid_size(_grid()),
    "decode.sdpa-inputs": lambda: sdpa_inputs(_grid()),
    "decode.headline": lambda: decode_table(_grid()),
    "decode.grid": lambda: grid_table(_grid()),
    "decode.vs-sdpa": lambda: vs_sdpa(_grid()),
    "decode.batch-one": lambda: batch_one(_grid()),
    "decode.large": lambda: large(_grid()),
    "decode.prefetch": lambda: prefetch_table(_grid()),
    "decode.auto": lambda: auto_table(_grid()),
    "decode.auto-target": lambda: f"{AUTO_WITHIN:.0%}",
    "decode.auto-misses": lambda: auto_misses(_grid()),
    "decode.vllm": lambda: vllm_table(_vllm()),
    "decode.vllm-target": lambda: f"{VLLM_WITHIN:.0%}",
    "decode.vllm-build": lambda: vllm_build(_vllm()),
    "decode.vllm-tree": lambda: vllm_tree(_vllm()),
    "decode.targets": lambda: targets_table(*(load_result("h200", name) for name in (
        "attention", "attention_small", "attention_mixed", "attention_fp8", "attention_vllm"))),
    "decode.ratio-targets": lambda: ratio_targets_table(*(load_result("h200", name)
                                                           for name in RATIO_TARGET_RESULTS)),
}
