"""Decode-attention kernels on the GPU: ms, GB/s of KV read (each byte once) and % of the HBM
roofline measured in the same run, for vllm_v1 and gqa with and without L2 prefetch, beside torch
SDPA on the same K/V gathered dense and contiguous (`enable_gqa=True`).

Every timing is the median of CUDA-event runs with L2 flushed before each run.
"""

import argparse
import itertools
import json
import sys

import torch
import torch.nn.functional as F

from kvlab.bench.env import run_info
from kvlab.cache import PagedKVCache
from kvlab.config import MODELS
from kvlab.kernels import gqa, vllm_v1
from kvlab.kernels.decode import DecodePlan
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.timing import METHOD, Timer, copy_roofline_gbps

PAPER_MODELS = ("llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b")
MAX_KV_BYTES = 48 * 2**30  # one layer's paged K/V plus its dense copy must fit beside each other


def prefetch_variants(modes, distances, evict_last: bool = False) -> list[PrefetchConfig]:
    """No prefetch, then each mode at each distance (and its evict-last twin when asked)."""
    policies = (False, True) if evict_last else (False,)
    return [PrefetchConfig()] + [
        PrefetchConfig(m, distance=d, evict_last=e)
        for m in modes if m != "none" for d in distances for e in policies
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64, 128])
    parser.add_argument("--contexts", nargs="+", type=int, default=[1024, 4096, 8192, 32768])
    parser.add_argument("--block-sizes", nargs="+", type=int, default=[16, 32, 128])
    parser.add_argument("--prefetch", nargs="+", default=["none", "bulk", "line"],
                        choices=["none", "bulk", "line"])
    parser.add_argument("--distances", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--evict-last", action="store_true",
                        help="also time each prefetch setting with the evict-last L2 policy")
    parser.add_argument("--kernels", nargs="+", default=["vllm_v1", "gqa", "sdpa"],
                        choices=["vllm_v1", "gqa", "sdpa", "auto"],
                        help="'auto' also times kernel='auto' on each family's cache")
    parser.add_argument("--runs", type=int, default=25, help="timed runs per point (median)")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every point")


def _filled_cache(model, batch, context, block_size, layout, dtype):
    """A cache holding `batch` sequences of `context` random tokens, scattered over the pool."""
    num_blocks = batch * -(-context // block_size)
    cache = PagedKVCache(num_blocks, block_size, model.num_kv_heads, model.head_dim, dtype=dtype,
                         device="cuda", layout=layout, seed=0)
    cache.k_cache.normal_()
    cache.v_cache.normal_()
    # NOTE: the data is random either way, so sequences are placed without writing K/V again.
    seq_ids = [cache.manager.add_sequence(context).seq_id for _ in range(batch)]
    return cache, seq_ids


def _time_paged(timer, kernel, model, batch, context, block_size, variants, dtype, auto):
    family = vllm_v1 if kernel == "vllm_v1" else gqa
    if block_size not in family.BLOCK_SIZES:
        return []
    cache, seq_ids = _filled_cache(model, batch, context, block_size, family.LAYOUT, dtype)
    q = torch.randn(batch, model.num_qo_heads, model.head_dim, device="cuda", dtype=dtype)
    plans = {(kernel, p.label()): DecodePlan(cache, seq_ids, model.num_qo_heads, kernel=kernel,
                                             prefetch=p) for p in variants}
    if auto:  # it measures its candidates now, in the plan
        plan = DecodePlan(cache, seq_ids, model.num_qo_heads, kernel="auto")
        plans["auto", plan.prefetch.label()] = plan
    out = torch.empty_like(q)
    times = timer.medians_ms({key: lambda plan=plan: plan.run(q, out=out)
                              for key, plan in plans.items()})
    return [{"kernel": name, "prefetch": label, "ms": times[name, label],
             **({"family": kernel} if name == "auto" else {})}
            for name, label in plans]


def auto_ratios(rows) -> list[float]:
    """For each `auto` row: its time over the fastest variant of its family measured at the same
    point and block size (1.0 = auto picked the best)."""
    ratios = []
    for auto in (r for r in rows if r["kernel"] == "auto"):
        same = [r["ms"] for r in rows if r["kernel"] == auto["family"]
                and all(r[k] == auto[k] for k in ("model", "batch", "context", "block_size"))]
        ratios.append(auto["ms"] / min(same))
    return ratios


def _time_sdpa(timer, model, batch, context, dtype):
    shape = (batch, model.num_kv_heads, context, model.head_dim)
    k = torch.randn(shape, device="cuda", dtype=dtype)
    v = torch.randn(shape, device="cuda", dtype=dtype)
    q = torch.randn(batch, model.num_qo_heads, 1, model.head_dim, device="cuda", dtype=dtype)
    ms = timer.median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    return [{"kernel": "sdpa", "prefetch": "none", "block_size": None, "ms": ms}]


def run(args) -> dict:
    dtype = torch.float16
    timer = Timer("cuda", num_runs=args.runs)
    roofline = copy_roofline_gbps(timer)
    variants = prefetch_variants(args.prefetch, args.distances, args.evict_last)
    result = {
        "benchmark": "attention", **run_info(), **gpu_info(),
        "dtype": "float16", "num_runs": args.runs, "l2_flushed": True, "timing": METHOD,
        "roofline_copy_gbps": round(roofline, 1), "rows": [], "skipped": [],
    }
    rows, skipped = result["rows"], result["skipped"]
    points = list(itertools.product(args.models, args.batches, args.contexts))
    for i, (name, batch, context) in enumerate(points):
        model = MODELS[name]
        kv_bytes = 2 * batch * context * model.kv_size * 2
        if kv_bytes > MAX_KV_BYTES:
            skipped.append({"model": name, "batch": batch, "context": context,
                            "reason": f"{kv_bytes / 2**30:.0f} GiB of K/V for one layer"})
            continue
        print(f"[{i + 1}/{len(points)}] {name} batch={batch} context={context}", file=sys.stderr)
        point_rows = []
        for block_size in args.block_sizes:
            for kernel in ("vllm_v1", "gqa"):
                if kernel in args.kernels:
                    for row in _time_paged(timer, kernel, model, batch, context, block_size,
                                           variants, dtype, "auto" in args.kernels):
                        point_rows.append({**row, "block_size": block_size})
                torch.cuda.empty_cache()
        if "sdpa" in args.kernels:
            point_rows += _time_sdpa(timer, model, batch, context, dtype)
            torch.cuda.empty_cache()
        for row in point_rows:
            gbps = kv_bytes / (row["ms"] * 1e-3) / 1e9
            rows.append({"model": name, "num_qo_heads": model.num_qo_heads,
                         "num_kv_heads": model.num_kv_heads, "batch": batch, "context": context,
                         **row, "kv_bytes": kv_bytes, "gbps": round(gbps, 1),
                         "pct_roofline": round(100 * gbps / roofline, 1)})
        if "auto" in args.kernels:
            result["auto_worst_ratio"] = round(max(auto_ratios(rows), default=1.0), 3)
        if args.checkpoint:
            with open(args.checkpoint, "w") as f:
                json.dump(result, f)
    return result


def gpu_info() -> dict:
    import cupy

    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "num_sms": props.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "cupy": cupy.__version__}


def report(result: dict) -> str:
    lines = [f"{result['gpu']}: copy roofline {result['roofline_copy_gbps']:.0f} GB/s "
             f"(median of {result['num_runs']}, L2 flushed)",
             f"{'model':12} {'B':>4} {'ctx':>6} {'bs':>4} {'kernel':8} {'prefetch':22} "
             f"{'ms':>8} {'GB/s':>7} {'%roof':>6}"]
    for r in result["rows"]:
        lines.append(f"{r['model']:12} {r['batch']:>4} {r['context']:>6} "
                     f"{r['block_size'] or '-':>4} {r['kernel']:8} {r['prefetch']:22} "
                     f"{r['ms']:>8.3f} {r['gbps']:>7.0f} {r['pct_roofline']:>6.1f}")
    lines += [f"skipped {s['model']} B={s['batch']} ctx={s['context']}: {s['reason']}"
              for s in result["skipped"]]
    if "auto_worst_ratio" in result:
        lines.append(f"kernel='auto' vs the fastest variant of its family at each point: at worst "
                     f"{result['auto_worst_ratio']:.3f}x its time")
    return "\n".join(lines)
