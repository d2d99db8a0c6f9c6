"""FlashInfer's paged decode beside gqa on the attention grid and the mixed-length batches, and
HF's static cache, eager and compiled, beside kvlab end to end: the H100's recordings
(results/h100/attention_flashinfer.json, attention_flashinfer_mixed.json, e2e_hf.json) and the
H200's that time FlashInfer in gqa's loop (H200_FILES; docs/flashinfer.md).
"""

from __future__ import annotations

from kvlab.bench.stats import tally, versus
from kvlab.results import load_result

from .common import context_label, heads, loops, source, value_range

GRID = ("h100", "attention_flashinfer")
MIXED = ("h100", "attention_flashinfer_mixed")
E2E = ("h100", "e2e_hf")
# FlashInfer's kernel, the gqa kernel on the same cache, what the FlashInfer kernel is
PEERS = (("flashinfer", "gqa", "CUDA-core decode"),
         ("flashinfer_tc", "gqa", "tensor-core path"),
         ("flashinfer_fp8", "gqa_fp8", "CUDA-core decode, fp8 cache"),
         ("flashinfer_tc_fp8", "gqa_fp8", "tensor-core path, fp8 cache"))
TABLE_POINTS = ((1, 32768), (16, 1024), (64, 8192))  # the grid table's (batch, context)
# the H200's recordings with FlashInfer in gqa's loop, and the small points of issue #51's target
H200_FILES = ("attention_small", "attention_mixed", "attention_fp8", "attention_bf16")
SMALL_POINTS = ((1, 32768), (16, 1024), (1, 8192))
TARGET_POINTS = ((1, 32768), (16, 1024))
# not measured here: the % of the H200's copy roofline that published Hopper decode kernels (FA3,
# FlashInfer, XQA) reach at these points in vLLM's kernel benchmarks, as issue #51 cites them
PUBLISHED_PCT = {(1, 32768): 72, (16, 1024): 50}


def _cell(mine: dict, peer: dict | None) -> str:
    """gqa's speed-up over the peer at one point (the peer's ms over gqa's), with the outcome
    where it is not a win."""
    if peer is None:
        return "-"
    outcome = versus(mine["ms_runs"], peer["ms_runs"])
    return f"{peer['ms'] / mine['ms']:.2f}x" + ("" if outcome == "win" else f" ({outcome})")


def _versus_both(p: dict) -> str:
    """The last two cells of a row: gqa's speed-up over each FlashInfer kernel at point `p`."""
    return f"{_cell(p['gqa'], p.get('flashinfer'))} | {_cell(p['gqa'], p.get('flashinfer_tc'))}"


def tally_table(result: dict) -> list[str]:
    """Per FlashInfer kernel: the grid's points where it ran, gqa's wins, ties and losses
    against it (kvlab.bench.stats, same loop) and the range of gqa's speed over it."""
    lines = ["| FlashInfer | against | points | gqa faster | ties | gqa slower | gqa's speed "
             "over FlashInfer's |", "|---|---|---|---|---|---|---|"]
    timed = loops(result).values()
    for peer, mine, what in PEERS:
        pairs = [(p[mine], p[peer]) for p in timed if peer in p and mine in p]
        if not pairs:
            continue
        counts = tally((a["ms_runs"], b["ms_runs"]) for a, b in pairs)
        lines.append(f"| `{peer}` ({what}) | `{mine}` | {len(pairs)} | {counts['win']} | "
                     f"{counts['tie']} | {counts['loss']} | "
                     f"{value_range([b['ms'] / a['ms'] for a, b in pairs], '{:.3f}')} |")
    return lines


def outcomes(result: dict, outcome: str) -> str:
    """The points where gqa's outcome against a FlashInfer kernel was `outcome` ("loss",
    "tie"), with gqa's speed-up there, or "none"."""
    found = [f"`{peer}` at {model} {batch} x {context_label(context)} "
             f"({p[peer]['ms'] / p[mine]['ms']:.3f}x)"
             for (model, batch, context, _), p in loops(result).items()
             for peer, mine, _ in PEERS if peer in p and mine in p
             and versus(p[mine]["ms_runs"], p[peer]["ms_runs"]) == outcome]
    return "; ".join(found) or "none"


def unsupported(result: dict) -> str:
    """The models FlashInfer's CUDA-core decode skipped, with their groups."""
    models = sorted({s["model"] for s in result["skipped"] if s.get("kernel") == "flashinfer"})
    return ", ".join(f"{m} ({heads(m)})" for m in models) or "none"


def too_big(result: dict) -> str:
    """The grid's points left out for memory."""
    points = [f"{s['model']} {s['batch']} x {context_label(s['context'])}"
              for s in result["skipped"] if "kernel" not in s]
    return ", ".join(points) or "none"


def grid_table(result: dict, points=TABLE_POINTS) -> list[str]:
    """Per model and point: gqa's and each FlashInfer kernel's % of the copy roofline, and
    gqa's speed over each (fp16 cache)."""
    lines = ["| model (q:kv) | batch x context | gqa | flashinfer | flashinfer_tc | gqa's "
             "speed-up over flashinfer | over flashinfer_tc |", "|---|---|---|---|---|---|---|"]
    timed = loops(result)
    for (model, batch, context, _), p in timed.items():
        if (batch, context) not in points:
            continue
        pct = {k: f"{p[k]['pct_roofline']:.0f}%" if k in p else "-"
               for k in ("gqa", "flashinfer", "flashinfer_tc")}
        lines.append(f"| {model} ({heads(model)}) | {batch} x {context_label(context)} | "
                     f"{pct['gqa']} | {pct['flashinfer']} | {pct['flashinfer_tc']} | "
                     f"{_versus_both(p)} |")
    return lines


def mixed_table(result: dict) -> list[str]:
    """Per model, lengths spec and batch: each kernel's ms and gqa's speed over FlashInfer's."""
    lines = ["| model (q:kv) | lengths | batch | vllm_v1 | gqa | flashinfer | flashinfer_tc | "
             "gqa's speed-up over flashinfer | over flashinfer_tc |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (model, batch, _, lengths), p in loops(result).items():
        ms = {k: f"{p[k]['ms'] * 1e3:,.0f} us" if k in p else "-"
              for k in ("vllm_v1", "gqa", "flashinfer", "flashinfer_tc")}
        lines.append(f"| {model} ({heads(model)}) | `{lengths}` | {batch} | {ms['vllm_v1']} | "
                     f"{ms['gqa']} | {ms['flashinfer']} | {ms['flashinfer_tc']} | "
                     f"{_versus_both(p)} |")
    return lines


def e2e_table(result: dict) -> list[str]:
    """Per model and batch: kvlab's step queued ahead (gqa) and waited for (gqa+sync, HF's
    basis; "not recorded" where the run lacks it), HF's compiled and eager static-cache steps
    (ms and tokens/s), kvlab's speed over each, and gqa's step over the roofline step."""
    lines = ["| model | batch | kvlab (gqa) | kvlab, each step waited for (gqa+sync) | HF "
             "compiled | HF eager | kvlab's speed-up over HF compiled: gqa | gqa+sync | over "
             "HF eager: gqa | kvlab's step / the roofline step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_point: dict = {}
    for r in result["rows"]:
        by_point.setdefault((r["model"], r["batch"]), {})[r["variant"]] = r
    for (model, batch), v in by_point.items():
        mine, hf, eager, waited = v["gqa"], v["hf-static"], v["hf-static-eager"], v.get(
            "gqa+sync")
        if not hf["compiled"] or eager["compiled"]:
            raise ValueError(f"{model} batch {batch}: hf-static must be the compiled peer, "
                             "hf-static-eager the eager one")
        cell = [f"{r['step_ms']:.2f} ms ({r['tokens_per_s']:,.0f} tok/s)" if r else
                "not recorded" for r in (mine, waited, hf, eager)]
        over_waited = f"{hf['step_ms'] / waited['step_ms']:.2f}x" if waited else "-"
        lines.append(f"| {model} | {batch} | {' | '.join(cell)} | "
                     f"{hf['step_ms'] / mine['step_ms']:.2f}x | {over_waited} | "
                     f"{eager['step_ms'] / mine['step_ms']:.2f}x | "
                     f"{mine['ratio_to_roofline']:.2f}x |")
    return lines


def _count(results, fp8: bool) -> str:
    """gqa's wins and ties against FlashInfer's two paths over `results` (pairs of a kernel and
    a point), on fp16 or on an fp8 cache: "86 of 87 on fp16 (9 ties)"."""
    pairs = [(p[mine], p[peer]) for result in results for p in loops(result).values()
             for peer, mine, _ in PEERS if mine.endswith("_fp8") == fp8
             and peer in p and mine in p]
    counts = tally((a["ms_runs"], b["ms_runs"]) for a, b in pairs)
    return (f"{counts['win'] + counts['tie']} of {len(pairs)} on "
            f"{'an fp8 cache' if fp8 else 'fp16'} ({counts['tie']} "
            f"tie{'' if counts['tie'] == 1 else 's'})")


def headline(grid: dict, e2e: dict) -> str:
    """gqa against FlashInfer's two paths over the grid (fp16 and fp8 pairs of a kernel and a
    point), and kvlab's step over HF's compiled one, for the README."""
    steps = {r["model"]: r for r in e2e["rows"] if r["variant"] == "gqa"}
    hf = {r["model"]: r for r in e2e["rows"] if r["variant"] == "hf-static" and r["compiled"]}
    ratios = [f"{hf[m]['step_ms'] / steps[m]['step_ms']:.2f}x ({m}, batch {steps[m]['batch']})"
              for m in steps if m in hf]
    return (f"`gqa` is faster than FlashInfer or tied within the run-to-run spread (its "
            f"CUDA-core and tensor-core decode, each point of the grid a pair) at "
            f"{_count([grid], False)} and {_count([grid], True)}; kvlab decodes "
            f"{' and '.join(ratios)} as fast as HF's compiled static cache")


def h200_results() -> dict:
    """H200_FILES' recordings by name."""
    return {name: load_result("h200", name) for name in H200_FILES}


def h200_tally() -> list[str]:
    """tally_table's rows for each of the H200's recordings, each under its name."""
    lines = ["| recording | FlashInfer | against | points | gqa faster | ties | gqa slower | gqa's "
             "speed over FlashInfer's |", "|---|---|---|---|---|---|---|---|"]
    for name, result in h200_results().items():
        lines += [f"| `{name}` {row}" for row in tally_table(result)[2:]]
    return lines


def h200_outcomes(outcome: str) -> str:
    """`outcomes` over the H200's recordings, each list under its recording's name."""
    found = [f"in `{name}`: {listed}" for name, result in h200_results().items()
             if (listed := outcomes(result, outcome)) != "none"]
    return "; ".join(found) or "none"


def small_target(result: dict, points=TARGET_POINTS) -> str:
    """The (model, point) pairs of `points` where gqa is at least as fast as every FlashInfer
    kernel that ran there (a win or a tie, same loop), of all such pairs: "8 of 8"."""
    timed = [p for (_, batch, context, _), p in loops(result).items()
             if (batch, context) in points]
    met = [p for p in timed if all(versus(p["gqa"]["ms_runs"], p[peer]["ms_runs"]) != "loss"
                                   for peer in ("flashinfer", "flashinfer_tc") if peer in p)]
    return f"{len(met)} of {len(timed)}"


def published() -> str:
    """PUBLISHED_PCT in words: "about 72% of the copy roofline at 1 x 32k and about 50% at ..."."""
    (first, pct), *rest = PUBLISHED_PCT.items()
    return " and ".join([f"about {pct}% of the copy roofline at {first[0]} x "
                         f"{context_label(first[1])}"] +
                        [f"about {p}% at {b} x {context_label(c)}" for (b, c), p in rest])


def h200_headline() -> str:
    """gqa against FlashInfer's two paths over the H200's recordings, for the README."""
    results = list(h200_results().values())
    return (f"on the H200 `gqa` is faster or tied at {_count(results, False)} and "
            f"{_count(results, True)}, over its small-shape, mixed-length, fp8 and bf16 "
            "recordings (its grid with FlashInfer is not recorded yet)")


def checks() -> list[str]:
    """Per recording: the GPU tests and sanitizers run on its code, from its own call
    (`gpu_checks`) and from later calls on the same code (`gpu_checks_added`, a list of them,
    copied by hand from their logs), with the command and revision."""
    lines = []
    for machine, name in (GRID, MIXED, E2E, *(("h200", name) for name in H200_FILES)):
        result = load_result(machine, name)
        found = ([result["gpu_checks"]] if "gpu_checks" in result else []) + result.get(
            "gpu_checks_added", [])
        if not found:
            lines.append(f"- `{machine}/{name}` (at {result['git_revision'][:7]}): none recorded")
        for c in found:
            where = (f"at {c['revision'][:7]} (`{c['command']}`)" if "revision" in c
                     else f"at {result['git_revision'][:7]}, before the benchmark")
            ran = ([f"tests {c['tests']}"] if "tests" in c else []) + [
                f"compute-sanitizer {tool} {c[tool]}" for tool in ("memcheck", "racecheck")
                if tool in c]
            lines.append(f"- `{machine}/{name}`, {where}: {'; '.join(ran)}")
    return lines


BLOCKS = {
    "flashinfer.source": lambda: source(*GRID),
    "flashinfer.source-mixed": lambda: source(*MIXED),
    "flashinfer.source-e2e": lambda: source(*E2E),
    "flashinfer.tally": lambda: tally_table(load_result(*GRID)),
    "flashinfer.losses": lambda: outcomes(load_result(*GRID), "loss"),
    "flashinfer.ties": lambda: outcomes(load_result(*GRID), "tie"),
    "flashinfer.unsupported": lambda: unsupported(load_result(*GRID)),
    "flashinfer.too-big": lambda: too_big(load_result(*GRID)),
    "flashinfer.table": lambda: grid_table(load_result(*GRID)),
    "flashinfer.mixed": lambda: mixed_table(load_result(*MIXED)),
    "flashinfer.e2e": lambda: e2e_table(load_result(*E2E)),
    "flashinfer.checks": checks,
    "flashinfer.h200-source": lambda: "; ".join(source("h200", name) for name in H200_FILES),
    "flashinfer.h200-tally": h200_tally,
    "flashinfer.h200-losses": lambda: h200_outcomes("loss"),
    "flashinfer.h200-ties": lambda: h200_outcomes("tie"),
    "flashinfer.h200-small": lambda: grid_table(load_result("h200", "attention_small"),
                                                SMALL_POINTS),
    "flashinfer.h200-target": lambda: small_target(load_result("h200", "attention_small")),
    "flashinfer.published": published,
}
