"""Where a decode step's time goes, CTA by CTA: `python -m kvlab bench timeline`.

At each point (model, BATCHxCONTEXT, or a batch of mixed lengths with `--lengths SPEC` as in
`bench attention`; fp16, block 16, blocks scattered over the pool),
one loop times `gqa` and a plain read of the point's K/V bytes in turn
(`kvlab.timing.Timer`: L2 flushed by a read, medians of --runs), with the copy roofline measured
in the same run. Then --traces steps of each are traced, in turn, on builds of the same kernels
that stamp every CTA's start, stages and end (`kvlab.kernels.timeline`), prepared as the timed
runs are. Each row holds the timed medians, the phases of each traced step and their medians
(`kvlab.kernels.timeline.phases`), and the stamps of the traced step whose span is the median
(what the dashboard draws). A row of mixed lengths carries `lengths` (the spec), `context` (the
batch's mean length, rounded) and `max_context`.

The gap between a small step and a read of its bytes is the sum of what a read does not do: the
block table read before the first K/V copy (`ready_us`), the last tile's math and the epilogue
(`epilogue_us`), and the merge of a split launch after the decode grid's end
(`merge_end_after_us`). The spans here are the GPU's: CUDA events add the launches' start
(the timed `ms` minus the traced span).
"""

from __future__ import annotations

import statistics
import sys

import torch

from kvlab.bench.env import gpu_info, gpu_state, run_info, write_checkpoint
from kvlab.cache import filled_cache
from kvlab.config import MODELS
from kvlab.kernels.decode import DecodePlan
from kvlab.kernels.gqa import FAMILY as GQA
from kvlab.kernels.read import PlainRead
from kvlab.kernels.timeline import Tracer, median_phases, phases
from kvlab.timing import METHOD, Timer, copy_roofline_gbps
from kvlab.workload import batch_shape

BLOCK_SIZE = 16
DEFAULT_POINTS = [(1, 32768), (1, 8192), (16, 1024), (16, 4096)]
DEFAULT_BATCHES = [16, 64]  # of each --lengths spec


def shapes(args) -> list[tuple[int, int | str]]:
    """(batch, context or lengths spec) of each point, for every model: each --lengths spec at
    each of --batches (default DEFAULT_BATCHES), else --points (default DEFAULT_POINTS)."""
    if args.lengths:
        return [(b, spec) for b in (args.batches or DEFAULT_BATCHES) for spec in args.lengths]
    return list(args.points or DEFAULT_POINTS)


def check(args) -> None:
    """Raise ValueError for points given two ways, a model `gqa` cannot run, or without a CUDA
    GPU and CuPy."""
    from kvlab.device import backend

    if args.points and args.lengths:
        raise ValueError("--points and --lengths: give one (--points are batches of equal "
                         "lengths)")
    if args.batches and not args.lengths:
        raise ValueError("--batches: the sizes of the --lengths batches; without --lengths "
                         "give --points")

    for name in args.models:
        m = MODELS[name]
        if m.head_dim not in GQA.head_dims or m.gqa_group > GQA.max_group:
            raise ValueError(f"--models {name}: gqa runs head_dim {GQA.head_dims} and up to "
                             f"{GQA.max_group} query heads a KV head ({name}: head_dim "
                             f"{m.head_dim}, {m.gqa_group})")
    if backend() != "cuda":
        raise ValueError("python -m kvlab bench timeline needs a CUDA GPU usable through torch "
                         "and CuPy (kvlab.backend() is 'sim' here)")


def point_row(name: str, batch: int, shape: int | str, timer: Timer, num_traces: int,
              roofline_gbps: float) -> dict:
    """Time and trace one point: `batch` sequences of `shape` tokens, or of the lengths of a
    lognormal spec (see the module's docstring)."""
    m = MODELS[name]
    shape, context, tokens, mixed = batch_shape(batch, shape)
    cache, ids, _ = filled_cache(batch, shape, BLOCK_SIZE, m.num_kv_heads, m.head_dim,
                                 layout="hnd", dtype=torch.float16)
    q = torch.randn(batch, m.num_qo_heads, m.head_dim, device=cache.device,
                    dtype=torch.float16)
    out = torch.empty_like(q)
    kv_bytes = 2 * tokens * m.kv_size * 2
    tracer = Tracer(cache, ids, m.num_qo_heads, kv_bytes)
    plan, read = DecodePlan(cache, ids, m.num_qo_heads, "gqa"), PlainRead(kv_bytes, cache.device)
    times = timer.times_ms({"gqa": lambda: plan.run(q, out=out), "read": read.read})
    traced_out = torch.empty_like(q)
    spin = max(timer.spin_cycles(f) for f in (lambda: tracer.plan.run(q, out=traced_out),
                                              tracer.read.read))
    steps = []
    for _ in range(num_traces):
        decode, merge = tracer.trace_gqa(q, traced_out, timer, spin)
        steps.append((decode, merge, tracer.trace_read(timer, spin)))
    if not torch.equal(out, traced_out):
        raise RuntimeError(f"{name} {batch}x{context}: the traced build's output differs from "
                           "the plain build's")
    each = [phases(*step) for step in steps]
    spans = [p["step_span_us"] for p in each]
    shown = steps[spans.index(sorted(spans)[(len(spans) - 1) // 2])]
    launcher = plan.launcher
    ms = {k: statistics.median(v) for k, v in times.items()}
    gbps = {k: kv_bytes / (v * 1e-3) / 1e9 for k, v in ms.items()}
    return {"model": name, "num_qo_heads": m.num_qo_heads, "num_kv_heads": m.num_kv_heads,
            "batch": batch, "context": context, **mixed, "block_size": BLOCK_SIZE,
            "kv_bytes": kv_bytes,
            "partition_size": launcher.partition_size if launcher.num_partitions > 1 else 0,
            "num_partitions": launcher.num_partitions, "warps": launcher.warps,
            "ms": {k: round(v, 5) for k, v in ms.items()},
            "ms_runs": {k: [round(t, 5) for t in v] for k, v in times.items()},
            "pct_roofline": {k: round(100 * v / roofline_gbps, 1) for k, v in gbps.items()},
            "phases": median_phases(each), "phases_runs": each,
            "trace": {"decode": shown[0].to_dict(),
                      "merge": None if shown[1] is None else shown[1].to_dict(),
                      "read": shown[2].to_dict()}}


def run(args) -> dict:
    timer = Timer("cuda", num_runs=args.runs)
    result = {"benchmark": "timeline", **run_info(), **gpu_info(), "dtype": "float16",
              "num_runs": args.runs, "num_traces": args.traces, "l2_flushed": True,
              "timing": METHOD, "command": args.command}
    result["roofline_copy_gbps"] = round(copy_roofline_gbps(timer), 1)
    result["clocks_after_roofline"] = gpu_state()
    result["rows"] = []
    points = [(name, batch, shape) for name in args.models for batch, shape in shapes(args)]
    for i, (name, batch, shape) in enumerate(points):
        print(f"[{i + 1}/{len(points)}] {name} {batch}x{shape}", file=sys.stderr)
        result["rows"].append(point_row(name, batch, shape, timer, args.traces,
                                        result["roofline_copy_gbps"]))
        torch.cuda.empty_cache()
        write_checkpoint(args.checkpoint, result)
    result["clocks_end"] = gpu_state()
    return result


def report(result: dict) -> str:
    lines = [f"{result['gpu']}: copy roofline {result['roofline_copy_gbps']:.0f} GB/s. Timed: "
             "us (% of the roofline). Traced (us, medians): the step's span and the read's, and "
             "per decode CTA the time to its block ids, to its first copies issued, to its "
             "first tile, in its loop and after it; the merge's end after the decode's last CTA",
             f"{'model':<12} {'point':>9} {'gqa':>15} {'read':>15} {'span':>6} {'read':>6} "
             f"{'ready':>6} {'issued':>6} {'landed':>6} {'loop':>6} {'epilog':>6} {'merge':>6}"]
    for r in result["rows"]:
        p, ms, pct = r["phases"], r["ms"], r["pct_roofline"]
        merge = p.get("merge_end_after_us")
        mixed = f" mixed, longest {r['max_context']}" if "lengths" in r else ""
        lines.append(
            f"{r['model']:<12} {r['batch']:>3}x{r['context']:<5} "
            f"{ms['gqa'] * 1000:>6.1f} ({pct['gqa']:>5.1f}%) "
            f"{ms['read'] * 1000:>6.1f} ({pct['read']:>5.1f}%) "
            f"{p['step_span_us']:>6.1f} {p['read_span_us']:>6.1f} {p['ready_us']:>6.2f} "
            f"{p['issued_us']:>6.2f} "
            f"{p['landed_us']:>6.2f} {p['loop_us']:>6.1f} {p['epilogue_us']:>6.2f} "
            + (f"{merge:>6.2f}" if merge is not None else f"{'-':>6}") + mixed)
    return "\n".join(lines)
