"""KVPR decode steps against full transfer and full recomputation: `python -m kvlab bench kvpr`.

For each model, batch and context it measures `v_com` and `v_gpu` (kvlab.offload.profiler), fills a
pinned host store with the context, and times decode steps (row-by-row schedule, weights resident;
CUDA events around each step, median of --steps after one warm-up step, every setting from the same
cached length) at:
- KVPR with the split l of each model of time ("paper", "chunked", "pipelined"), chosen again at
  every step as the context grows, as the paper does;
- full transfer (l = 0: every K, V byte crosses PCIe; the FlexGen-style baseline, same runtime);
- full recomputation (l = s').
Each row also has the predictions of the three models at its l, the lower bound
max(PCIe bytes / v_com, recompute FLOPs / v_gpu) summed over layers, and, from one more step with
the timeline on, the busy time of the link and of the GPU and the overlap achieved between them.
Points whose host store would not fit in --host-budget-gib are skipped, with the reason.
NOTE: contexts may pass a model's trained window (OPT: 2,048 learned positions): a layer's work
and bytes do not depend on it, and the weights are random anyway.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys

import torch

from kvlab.bench.env import run_info
from kvlab.config import MODELS
from kvlab.offload.host import HostStore, store_bytes
from kvlab.offload.model import random_layers
from kvlab.offload.profiler import profile
from kvlab.offload.runtime import KVPRDecoder, fill
from kvlab.offload.scheduler import MODELS_OF_TIME, LayerShape, best_split, layer_time

PAPER_MODELS = ("opt-6.7b", "opt-13b", "opt-30b", "llama2-7b", "llama3-8b")
SETTINGS = (*(f"kvpr-{m}" for m in MODELS_OF_TIME), "full-transfer", "full-recompute")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--contexts", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--steps", type=int, default=5, help="timed decode steps per setting")
    parser.add_argument("--chunks", type=int, default=4, help="X chunks per layer")
    parser.add_argument("--host-budget-gib", type=float, default=100.0,
                        help="skip points whose pinned host store is larger")


def split_for(setting: str, shape: LayerShape, hw, num_chunks: int) -> int:
    """The l a setting runs at for the cached length `shape.context`."""
    if setting == "full-transfer":
        return 0
    if setting == "full-recompute":
        return shape.context
    return best_split(shape, hw, setting.removeprefix("kvpr-"), num_chunks).l


def overlap(spans: list[dict]) -> dict:
    """Busy time of the link (H2D) and of the GPU (compute) over one step, and the share of the
    shorter of the two that ran under the longer: 1 = fully overlapped, 0 = one after the other."""
    step = max(s["end_us"] for s in spans) - min(s["start_us"] for s in spans)
    busy = {lane: sum(s["end_us"] - s["start_us"] for s in spans if s["lane"] == lane)
            for lane in ("H2D", "compute")}
    shorter = min(busy.values())
    hidden = busy["H2D"] + busy["compute"] - step
    share = min(max(hidden / shorter, 0.0), 1.0) if shorter > 0 else 1.0
    return {"link_busy_ms": busy["H2D"] / 1e3, "compute_busy_ms": busy["compute"] / 1e3,
            "overlap": round(share, 3)}


def _time_setting(decoder, store, hidden, setting, model, batch, context, hw, args) -> dict:
    def step(record=False):
        shape = LayerShape(model, batch, store.length)
        decoder.record = record
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        decoder.step(hidden, split_for(setting, shape, hw, args.chunks))
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    store.length = context  # every setting from the same cached length
    step()  # warm-up
    times = [step() for _ in range(args.steps)]
    store.length = context
    step(record=True)
    shape = LayerShape(model, batch, context)
    split = split_for(setting, shape, hw, args.chunks)
    ms = statistics.median(times)
    predicted = {m: 1e3 * model.num_layers * layer_time(shape, hw, split, m, args.chunks)
                 for m in MODELS_OF_TIME}
    return {"setting": setting, "l": split, "step_ms": ms, "step_ms_runs": times,
            "tokens_per_s": batch / (ms * 1e-3),
            **{f"predicted_{m}_ms": t for m, t in predicted.items()},
            "lower_bound_ms": predicted["pipelined"],
            "ratio_to_lower_bound": ms / predicted["pipelined"],
            **overlap(decoder.last_timeline.spans())}


def run(args) -> dict:
    if not torch.cuda.is_available():
        raise RuntimeError("python -m kvlab bench kvpr needs a CUDA GPU")
    props = torch.cuda.get_device_properties(0)
    result = {"benchmark": "kvpr", **run_info(), "gpu": props.name, "torch": torch.__version__,
              "dtype": "float16", "schedule": "row-by-row, weights resident",
              "steps": args.steps, "chunks": args.chunks, "rows": [], "skipped": []}
    budget = args.host_budget_gib * 2**30
    for name in args.models:
        model = MODELS[name]
        layers = random_layers(model, seed=0, dtype=torch.float16, device="cuda")
        for batch, context in itertools.product(args.batches, args.contexts):
            need = store_bytes(model, batch, context + args.steps + 3)["total"]
            if need > budget:
                reason = f"host store of {need / 2**30:.0f} GiB > {args.host_budget_gib:g} GiB"
                result["skipped"].append({"model": name, "batch": batch, "context": context,
                                          "reason": reason})
                continue
            print(f"{name} batch={batch} context={context}", file=sys.stderr)
            hw = profile(model, tokens=batch * context)
            store = HostStore(model, batch, context + args.steps + 3)
            fill(store, layers, context, device="cuda")
            decoder = KVPRDecoder(model, layers, store, "cuda", num_chunks=args.chunks)
            hidden = torch.randn(batch, model.hidden_size, dtype=torch.float16, device="cuda")
            point = {"model": name, "batch": batch, "context": context,
                     "h2d_gbps": hw.h2d_bytes_per_s / 1e9,
                     "recompute_tflops": hw.recompute_flops_per_s / 1e12}
            for setting in SETTINGS:
                row = _time_setting(decoder, store, hidden, setting, model, batch, context, hw,
                                    args)
                result["rows"].append({**point, **row})
            del decoder, store
            torch.cuda.empty_cache()
        del layers
        torch.cuda.empty_cache()
    return result


def report(result: dict) -> str:
    lines = [f"{result['gpu']}: KVPR decode steps ({result['schedule']}), median of "
             f"{result['steps']} steps",
             f"{'model':12} {'B':>3} {'ctx':>5} {'setting':16} {'l':>5} {'ms':>8} {'tok/s':>8} "
             f"{'xLB':>5} {'overlap':>7} {'vs full':>7}"]
    full = {(r["model"], r["batch"], r["context"]): r["step_ms"]
            for r in result["rows"] if r["setting"] == "full-transfer"}
    for r in result["rows"]:
        base = full.get((r["model"], r["batch"], r["context"]))
        speedup = f"{base / r['step_ms']:.2f}x" if base else "-"
        lines.append(f"{r['model']:12} {r['batch']:>3} {r['context']:>5} {r['setting']:16} "
                     f"{r['l']:>5} {r['step_ms']:>8.2f} {r['tokens_per_s']:>8.0f} "
                     f"{r['ratio_to_lower_bound']:>5.2f} {r['overlap']:>7.2f} {speedup:>7}")
    lines += [f"skipped {s['model']} B={s['batch']} ctx={s['context']}: {s['reason']}"
              for s in result["skipped"]]
    return "\n".join(lines)
