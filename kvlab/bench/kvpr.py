"""KVPR decode steps against its baselines: `python -m kvlab bench kvpr`.

For each model, batch and context it measures `v_com` and `v_gpu` (kvlab.offload.profiler), fills
pinned host stores with the context, and times decode steps of each schedule ("row": each GPU batch
through every layer in turn; "column": each layer over every GPU batch in turn), number of GPU
batches the batch is split into (--gpu-batches; the same GPU memory for both schedules) and
placement of the weights (--weights: resident on the GPU, or offloaded with the KV) at:
- KVPR with the split l of each model of time ("paper", "chunked", "pipelined");
- full transfer (l = 0: every K, V byte crosses PCIe; the FlexGen-style baseline, same runtime);
- full recomputation (l = s');
- with --hf, HF transformers' offloaded cache (`DynamicCache(offloading=True)`, what
  `cache_implementation="offloaded"` builds) on the same model sharing the same layer tensors,
  after an HF prefill of the context (row schedule, resident weights only).
Timing: CUDA events around each step, then a synchronize; one warm-up step per setting, then
--steps rounds (more, up to MAX_STEPS, where they would last under --min-seconds: short steps are
host-bound and vary more) in which the settings take turns (so slow drift of the machine hits
them alike), every step from the same cached length; the median is reported. HF steps are timed
the same way, on their own (the cache grows by one token per step).
The profile also measures T_L, the time of one layer's own work timed back to back (`layer_ms`),
and the host's time to enqueue a unit and each recompute chunk (`unit_host_ms`,
`chunk_host_ms`), which the pipelined model weighs against the link. Each row has the
predictions of the three models at its l, the point's lower bound (min over l of max(PCIe bytes /
v_com, recompute FLOPs / v_gpu), summed over the step's units; it leaves T_L and the host out)
and the ratio to it, and, from one more step with the timeline on, the busy time of the link and
of the GPU and the overlap between them.
The timeline of --timeline-setting is kept at the --timeline-points.
Points whose host memory would pass --host-budget-gib are skipped, with the reason (where only
HF's copy of the KV would pass it, the point runs without HF).
--resume PATH continues an earlier result or checkpoint, timed the same way on the same GPU: its
rows and timelines are kept, its points are not measured again, and `resumed_from` records the
runs it came from.
NOTE: contexts may pass a model's trained window (OPT: 2,048 learned positions): a layer's work
and bytes do not depend on it, and the weights are random anyway.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys

import torch

from kvlab.bench.env import run_info
from kvlab.checks import check_positive_int
from kvlab.config import MODELS
from kvlab.offload.host import HostStore, fill, store_bytes
from kvlab.offload.loop import predicted_seconds, timed_step
from kvlab.offload.model import random_layers
from kvlab.offload.profiler import profile
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import (
    MODELS_OF_TIME,
    SCHEDULES,
    WEIGHTS,
    best_split,
    lower_bound_seconds,
)
from kvlab.offload.timeline import overlap
from kvlab.offload.weights import HostLayers, Packing

PAPER_MODELS = ("opt-6.7b", "opt-13b", "opt-30b", "llama2-7b", "llama3-8b")
SETTINGS = (*(f"kvpr-{m}" for m in MODELS_OF_TIME), "full-transfer", "full-recompute")
HF_SETTING = "hf-offloaded"
MAX_STEPS = 25
HEADROOM = 2  # tokens past the context in each store: the step's new token, and one spare


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[8, 16, 32, 64])
    parser.add_argument("--contexts", nargs="+", type=int, default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--schedules", nargs="+", default=["row", "column"], choices=SCHEDULES)
    parser.add_argument("--gpu-batches", nargs="+", type=int, default=[1, 4],
                        help="GPU batches the batch is split into (column runs only with 2+: "
                             "with one it is the row schedule)")
    parser.add_argument("--weights", nargs="+", default=["resident"], choices=WEIGHTS)
    parser.add_argument("--steps", type=int, default=5, help="timed decode steps per setting")
    parser.add_argument("--min-seconds", type=float, default=0.5,
                        help=f"time more steps (up to {MAX_STEPS}) where --steps would time a "
                             "setting for less than this")
    parser.add_argument("--chunks", type=int, default=1,
                        help="X chunks per layer (each costs the host some 6 CUDA calls; with "
                             "the layers double-buffered, one chunk is fastest on the H200)")
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="replay each layer's work around the attention as CUDA graphs "
                             "(--no-cuda-graphs: enqueue it eagerly)")
    parser.add_argument("--hf", action="store_true",
                        help="also time HF's offloaded cache (row schedule, resident weights)")
    parser.add_argument("--hf-max-tokens", type=int, default=16384,
                        help="time HF only where batch x context is at most this")
    parser.add_argument("--timeline-setting", default="kvpr-pipelined", choices=SETTINGS)
    parser.add_argument("--timeline-points", nargs="*", default=["16x1024"],
                        help="BATCHxCONTEXT points whose timelines are kept")
    parser.add_argument("--host-budget-gib", type=float, default=100.0,
                        help="skip points whose pinned host memory would be larger")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="rewrite the result so far as JSON after every point")
    parser.add_argument("--resume", metavar="PATH",
                        help="continue the result or checkpoint at PATH: keep its rows, measure "
                             "only the points it lacks")


def split_for(setting: str, shape, rates, num_chunks: int) -> int:
    """The l a setting runs at for a unit of `shape` (its context is s')."""
    if setting == "full-transfer":
        return 0
    if setting == "full-recompute":
        return shape.context
    return best_split(shape, rates, setting.removeprefix("kvpr-"), num_chunks).l


def host_bytes(name: str, batch: int, context: int, weights: str = "resident",
               hf: bool = False) -> int:
    """Pinned host bytes a point needs: the stores, the offloaded weights, HF's offloaded KV.
    NOTE: `run` keeps a model's offloaded weights pinned from its first offloaded point on, so
    resident points after it hold them too (the budget is a guide, not an exact fit)."""
    model = MODELS[name]
    need = store_bytes(model, batch, context + HEADROOM)["total"]
    if weights == "offloaded":
        shapes = random_layers(model, dtype=torch.float16, device="meta", num_layers=1)[0]
        need += model.num_layers * Packing.of(shapes).num_bytes
    if hf:
        need += store_bytes(model, batch, context + HEADROOM)["kv"]
    return need


def measure_point(name: str, batch: int, context: int, *, schedule: str = "row",
                  gpu_batches: int = 1, weights: str = "resident", steps: int = 5,
                  chunks: int = 1, cuda_graphs: bool = True, hf: bool = False,
                  keep_timeline: bool = True,
                  timeline_setting: str = "kvpr-pipelined", layers=None, host_layers=None,
                  progress=None, min_seconds: float = 0.0) -> dict:
    """Time every setting at one point on the GPU: {"rows": [...], "timeline": {...} or None}.

    gpu_batches must divide batch (row schedules use 1). layers: the model's LayerWeights on the
    GPU (seeded random ones when None); they prefill the stores and, with weights="resident",
    run the steps. host_layers: their HostLayers for weights="offloaded" (packed here when
    None). progress: called with (steps done, steps in all) after each step. min_seconds: time
    up to MAX_STEPS steps per setting where `steps` would take less than this. cuda_graphs: the
    decoder's (and the profile's) layers as CUDA graphs, or eager.
    """
    check_settings(steps, chunks, [gpu_batches], min_seconds)
    for key, value in (("batch", batch), ("context", context)):
        check_positive_int(key, value)
    if name not in MODELS:
        raise ValueError(f"name={name!r}: must be one of {sorted(MODELS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: must be one of {SCHEDULES}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: must be one of {WEIGHTS}")
    if batch % gpu_batches:
        raise ValueError(f"gpu_batches={gpu_batches}: must divide batch={batch}")
    if hf and (schedule, gpu_batches, weights) != ("row", 1, "resident"):
        raise ValueError(f"hf=True with schedule={schedule!r}, gpu_batches={gpu_batches}, "
                         f"weights={weights!r}: HF's cache is compared with the row schedule, one "
                         "GPU batch, resident weights")
    if timeline_setting not in SETTINGS:
        raise ValueError(f"timeline_setting={timeline_setting!r}: must be one of {SETTINGS}")
    if not torch.cuda.is_available():
        raise RuntimeError("KVPR measurements need a CUDA GPU")
    model = MODELS[name]
    if layers is None:
        layers = random_layers(model, seed=0, dtype=torch.float16, device="cuda")
    if weights == "offloaded" and host_layers is None:
        host_layers = HostLayers(layers)
    point, rows, timeline = _kvpr_rows(
        name, batch, context, schedule, gpu_batches, layers if weights == "resident" else
        host_layers, layers, steps, chunks, cuda_graphs,
        timeline_setting if keep_timeline else None, progress, min_seconds,
    )  # returns with the stores and the decoder freed, before HF allocates its own
    if hf:
        rows.append({**point, **hf_offloaded_row(name, layers, batch, context, steps,
                                                 point["lower_bound_ms"])})
    torch.cuda.empty_cache()
    return {"rows": rows, "timeline": timeline}


def check_settings(steps: int, chunks: int, gpu_batches, min_seconds: float) -> None:
    """Raise ValueError, naming the value, unless the timing settings are usable."""
    check_positive_int("steps", steps)
    check_positive_int("chunks", chunks)
    for g in gpu_batches:
        check_positive_int("gpu_batches", g)
    if not (isinstance(min_seconds, (int, float)) and min_seconds >= 0):
        raise ValueError(f"min_seconds={min_seconds!r}: must be a number >= 0")


def _kvpr_rows(name, batch, context, schedule, gpu_batches, weights, layers, steps, chunks,
               cuda_graphs, timeline_setting, progress, min_seconds):
    """measure_point's KVPR settings: (the point's common fields, a row per setting, the
    timeline of `timeline_setting` or None)."""
    model = MODELS[name]
    stores = [HostStore(model, batch // gpu_batches, context + HEADROOM)
              for _ in range(gpu_batches)]
    for g, store in enumerate(stores):
        fill(store, layers, context, seed=1000 * g, device="cuda")
    # NOTE: after the fill: once, measured before it, as the last point's stores were being
    # freed, pinned H2D read 39 GB/s (55 in steady state)
    decoder = KVPRDecoder(model, weights, stores, "cuda", num_chunks=chunks, schedule=schedule,
                          cuda_graphs=cuda_graphs)
    rates = profile(model, batch // gpu_batches, context, decoder=decoder)
    hidden = torch.randn(batch, model.hidden_size, dtype=torch.float16, device="cuda")
    shape = decoder.unit_shape(context)
    splits = {s: split_for(s, shape, rates, chunks) for s in SETTINGS}
    times = {s: [] for s in SETTINGS}
    total, done = (steps + 2) * len(SETTINGS), 0

    def run(setting, record=False):
        nonlocal done
        for store in stores:
            store.length = context  # every step from the same cached length
        decoder.record = record
        ms = 1e3 * timed_step(decoder, hidden, splits[setting])[1]
        done += 1
        if progress is not None:
            progress(done, total)
        return ms

    warm = statistics.median(run(setting) for setting in SETTINGS)
    # short, host-bound steps vary more: give them more rounds
    steps = min(max(steps, math.ceil(1e3 * min_seconds / warm)), MAX_STEPS)
    total = (steps + 2) * len(SETTINGS)
    for _ in range(steps):
        for setting in SETTINGS:
            times[setting].append(run(setting))
    lower_bound = lower_bound_seconds(shape, rates) * len(decoder.units())
    point = {"model": name, "batch": batch, "context": context, "schedule": schedule,
             "gpu_batches": gpu_batches, "weights": decoder.weights, "cuda_graphs": cuda_graphs,
             "h2d_gbps": rates.h2d_bytes_per_s / 1e9, "d2h_gbps": rates.d2h_bytes_per_s / 1e9,
             "recompute_tflops": rates.recompute_flops_per_s / 1e12,
             "layer_ms": 1e3 * rates.layer_seconds, "unit_host_ms": 1e3 * rates.unit_host_seconds,
             "chunk_host_ms": 1e3 * rates.chunk_host_seconds,
             "lower_bound_ms": 1e3 * lower_bound}
    rows, timeline = [], None
    for setting in SETTINGS:
        run(setting, record=True)
        spans = decoder.last_timeline.spans()
        ms, l = statistics.median(times[setting]), splits[setting]
        rows.append({**point, "setting": setting, "l": l, "step_ms": ms,
                     "step_ms_runs": times[setting], "tokens_per_s": batch / (ms * 1e-3),
                     **{f"predicted_{m}_ms": 1e3 * predicted_seconds(decoder, rates, l, context, m)
                        for m in MODELS_OF_TIME},
                     "ratio_to_lower_bound": ms / point["lower_bound_ms"], **overlap(spans)})
        if setting == timeline_setting:
            timeline = {key: point[key] for key in ("model", "batch", "context", "schedule",
                                                     "gpu_batches", "weights")}
            timeline.update(setting=setting, l=l, step_ms=ms, spans=spans)
    return point, rows, timeline


def hf_offloaded_row(name: str, layers, batch: int, context: int, steps: int,
                     lower_bound_ms: float) -> dict:
    """HF's offloaded KV cache on `name` with `layers`' tensors: prefill `context` random tokens
    per sequence, then time decode steps (one warm-up, median of `steps`)."""
    import transformers

    from kvlab.offload.hf import cache_keyword, causal_lm

    model = MODELS[name]
    hf = causal_lm(model, layers, "cuda", max_position=context + steps + HEADROOM)
    cache = transformers.DynamicCache(config=hf.config, offloading=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(model.vocab_size, (batch, context + steps + 1), device="cuda",
                        generator=gen)
    kwargs = {cache_keyword(hf): cache, "use_cache": True}
    with torch.no_grad():
        hf(input_ids=ids[:, :context], logits_to_keep=1, **kwargs)
        times = []
        for i in range(steps + 1):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            hf(input_ids=ids[:, context + i:context + i + 1], **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    del hf, cache
    times = times[1:]  # the first step warms up
    ms = statistics.median(times)
    return {"setting": HF_SETTING, "schedule": "row", "gpu_batches": 1, "weights": "resident",
            "l": None, "step_ms": ms, "step_ms_runs": times, "tokens_per_s": batch / (ms * 1e-3),
            **{f"predicted_{m}_ms": None for m in MODELS_OF_TIME},
            "ratio_to_lower_bound": ms / lower_bound_ms, "link_busy_ms": None,
            "compute_busy_ms": None, "overlap": None}


def _points(text: list[str]) -> set[tuple[int, int]]:
    try:
        return {tuple(int(n) for n in p.lower().split("x")) for p in text}
    except ValueError as err:
        raise ValueError(f"--timeline-points {text}: must be BATCHxCONTEXT, e.g. 16x1024") from err


POINT = ("model", "batch", "context", "schedule", "gpu_batches", "weights")


def _point(entry: dict) -> tuple:
    return tuple(entry[key] for key in POINT)


def previous_result(path: str, args) -> dict:
    """The result or checkpoint at `path` that `args` resume: a kvpr result timed as `args` time
    (ValueError naming what differs)."""
    try:
        with open(path) as f:
            previous = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"--resume {path}: cannot read it as JSON ({err})") from err
    if not isinstance(previous, dict) or previous.get("benchmark") != "kvpr":
        raise ValueError(f"--resume {path}: not a result of python -m kvlab bench kvpr")
    missing = [key for key in ("gpu", "rows", "timelines", "skipped") if key not in previous]
    if missing:
        raise ValueError(f"--resume {path}: it lacks {', '.join(missing)}")
    timing = {"dtype": "float16", "steps": args.steps, "chunks": args.chunks,
              "cuda_graphs": args.cuda_graphs, "min_seconds": args.min_seconds}
    for key, value in timing.items():
        if previous.get(key) != value:
            raise ValueError(f"--resume {path}: it was timed with {key}={previous.get(key)!r}, "
                             f"this run with {key}={value!r}; a resumed run must time the same "
                             "way")
    return previous


def run(args) -> dict:
    keep = _points(args.timeline_points)
    check_settings(args.steps, args.chunks, args.gpu_batches, args.min_seconds)
    if args.hf and not ("row" in args.schedules and 1 in args.gpu_batches
                        and "resident" in args.weights):
        raise ValueError("--hf: HF's cache is compared with the row schedule, one GPU batch, "
                         "resident weights: add row, 1 and resident to the options")
    previous = previous_result(args.resume, args) if args.resume else None
    if not torch.cuda.is_available():
        raise RuntimeError("python -m kvlab bench kvpr needs a CUDA GPU")
    gpu = torch.cuda.get_device_name(0)
    if previous is not None and previous.get("gpu") != gpu:
        raise ValueError(f"--resume {args.resume}: measured on {previous.get('gpu')}, this GPU "
                         f"is {gpu}")
    result = {"benchmark": "kvpr", **run_info(), "gpu": gpu, "command": args.command,
              "torch": torch.__version__, "dtype": "float16", "steps": args.steps,
              "chunks": args.chunks, "cuda_graphs": args.cuda_graphs,
              "min_seconds": args.min_seconds,
              "timing": "CUDA events per step, settings interleaved, median after one warm-up "
              "step each", "rows": [], "timelines": [], "skipped": []}
    skipped = {}  # (point, setting or None) -> the entry; a later decision replaces one
    if previous is not None:
        result["rows"], result["timelines"] = previous["rows"], previous["timelines"]
        result["resumed_from"] = [*previous.get("resumed_from", []), {
            **{key: previous.get(key) for key in ("date", "kvlab", "torch", "command")},
            "points": len({_point(r) for r in previous["rows"]})}]
        skipped = {(_point(s), s.get("setting")): s for s in previous["skipped"]}
    measured = {_point(r) for r in result["rows"]}
    budget = args.host_budget_gib * 2**30

    def over_budget(need: int) -> str:
        return f"host memory of {need / 2**30:.0f} GiB > {args.host_budget_gib:g} GiB"

    for name in args.models:
        model = MODELS[name]
        layers = random_layers(model, seed=0, dtype=torch.float16, device="cuda")
        host_layers = None  # packed at the first offloaded point that fits
        for batch, context, schedule, gpu_batches, weights in itertools.product(
                args.batches, args.contexts, args.schedules, args.gpu_batches, args.weights):
            where = dict(zip(POINT, (name, batch, context, schedule, gpu_batches, weights),
                             strict=True))
            point = _point(where)
            if point in measured:
                continue
            for entry in [e for e in skipped if e[0] == point]:  # decided anew below
                del skipped[entry]
            hf = args.hf and (schedule, gpu_batches, weights) == ("row", 1, "resident") and (
                batch * context <= args.hf_max_tokens)
            need = host_bytes(name, batch, context, weights)
            reason = None
            if schedule == "column" and gpu_batches == 1:
                reason = "a column of one GPU batch is the row schedule"
            elif need > budget:
                reason = over_budget(need)
            elif batch % gpu_batches:
                reason = f"{gpu_batches} GPU batches do not divide batch {batch}"
            if reason is not None:
                skipped[point, None] = {**where, "reason": reason}
                continue
            with_hf = host_bytes(name, batch, context, weights, hf=True)
            if hf and with_hf > budget:  # the point runs without HF's copy of the KV
                hf = False
                skipped[point, HF_SETTING] = {**where, "setting": HF_SETTING,
                                              "reason": over_budget(with_hf)}
            print(f"{name} batch={batch} context={context} {schedule}/{gpu_batches} {weights}",
                  file=sys.stderr)
            if weights == "offloaded" and host_layers is None:
                host_layers = HostLayers(layers)
            point_result = measure_point(
                name, batch, context, schedule=schedule, gpu_batches=gpu_batches,
                weights=weights, steps=args.steps, chunks=args.chunks,
                cuda_graphs=args.cuda_graphs, hf=hf,
                keep_timeline=(batch, context) in keep, timeline_setting=args.timeline_setting,
                layers=layers, host_layers=host_layers, min_seconds=args.min_seconds,
            )
            result["rows"] += point_result["rows"]
            if point_result["timeline"] is not None:
                result["timelines"].append(point_result["timeline"])
            result["skipped"] = list(skipped.values())
            if args.checkpoint:
                with open(args.checkpoint, "w") as f:
                    json.dump(result, f)
        del layers, host_layers
        torch.cuda.empty_cache()
    result["skipped"] = list(skipped.values())
    return result


def report(result: dict) -> str:
    lines = [f"{result['gpu']}: KVPR decode steps, median of >= {result['steps']} steps",
             f"{'model':10} {'B':>3} {'ctx':>5} {'sched':8} {'weights':9} {'setting':15} "
             f"{'l':>5} {'ms':>8} {'tok/s':>7} {'xLB':>5} {'overlap':>7} {'vs full':>7}"]
    key = ("model", "batch", "context", "schedule", "gpu_batches", "weights")
    full = {tuple(r[k] for k in key): r["step_ms"]
            for r in result["rows"] if r["setting"] == "full-transfer"}
    for r in result["rows"]:
        base = full.get(tuple(r[k] for k in key))
        speedup = f"{base / r['step_ms']:.2f}x" if base else "-"
        split = "-" if r["l"] is None else r["l"]
        shared = "-" if r["overlap"] is None else f"{r['overlap']:.2f}"
        schedule = f"{r['schedule']}/{r['gpu_batches']}"
        lines.append(f"{r['model']:10} {r['batch']:>3} {r['context']:>5} {schedule:8} "
                     f"{r['weights']:9} {r['setting']:15} {split:>5} {r['step_ms']:>8.2f} "
                     f"{r['tokens_per_s']:>7.0f} {r['ratio_to_lower_bound']:>5.2f} "
                     f"{shared:>7} {speedup:>7}")
    lines += [f"skipped {s['model']} B={s['batch']} ctx={s['context']} {s['schedule']}/"
              f"{s['gpu_batches']} {s['weights']}{' ' + s['setting'] if 'setting' in s else ''}: "
              f"{s['reason']}" for s in result["skipped"]]
    return "\n".join(lines)
