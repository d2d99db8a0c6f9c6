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
Timing (`time_in_turn`): CUDA events around each step, then a synchronize, every step from the
same cached length (HF's cache gets back the K, V tensors it held before each of its steps).
First every setting warms up until two successive steps agree within 5% (at most
MAX_WARMUP_STEPS; a row says whether it got there: `steady`); then rounds in which every setting,
HF's cache among them, takes one step in turn (so slow drift of the machine hits them alike): at
least --steps rounds, more (up to
MAX_STEPS) while a setting has been timed for less than --min-seconds. Every step is recorded
(`warmup_ms`, `step_ms_runs`); the median is reported.
The profile also measures T_L, the time of one layer's own work timed back to back (`layer_ms`),
and the host's time to enqueue a unit and each recompute chunk (`unit_host_ms`,
`chunk_host_ms`), which the pipelined model weighs against the link. Each row has the
predictions of the three models at its l, the point's lower bound (min over l of max(PCIe bytes /
v_com, recompute FLOPs / v_gpu), summed over the step's units; it leaves T_L and the host out)
and the ratio to it, and, from one more step with its stream spans recorded, the busy time of
the link and of the GPU and the overlap between them (kvlab.offload.overlap).
The spans of --timeline-setting are kept at the --timeline-points, in the result's "timelines"
(the flags' and the key's names are recorded ones: in code they are the overlap).
Points whose host memory would pass --host-budget-gib are skipped, with the reason (where only
HF's copy of the KV would pass it, the point runs without HF).
--resume PATH continues an earlier result or checkpoint made by the same committed code (its git
revision, `kvlab.bench.env`), timed the same way on the same GPU: its rows and timelines are
kept, its points are not measured again, and `resumed_from` records the runs it came from.
NOTE: contexts may pass a model's trained window (OPT: 2,048 learned positions): a layer's work
and bytes do not depend on it, and the weights are random anyway.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Callable

import torch

from kvlab.bench.cli import KVPR_SETTINGS as SETTINGS
from kvlab.bench.env import git_state, gpu_info, gpu_state, run_info, write_checkpoint
from kvlab.bench.steps import WARMUP_TOLERANCE, HFSteps, time_in_turn
from kvlab.checks import check_positive_int
from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.host import HostStore, fill, store_bytes
from kvlab.offload.loop import predicted_seconds, timed_step
from kvlab.offload.overlap import overlap
from kvlab.offload.profiler import profile
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import (
    MODELS_OF_TIME,
    SCHEDULES,
    WEIGHTS,
    best_split,
    lower_bound_seconds,
)
from kvlab.offload.weights import HostLayers, Packing

HF_SETTING = "hf-offloaded"
HEADROOM = 2  # tokens past the context in each store: the step's new token, and one spare


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
                  gpu_batches: int = 1, weights: str = "resident", steps: int = 10,
                  chunks: int = 1, cuda_graphs: bool = True, hf: bool = False,
                  keep_overlap: bool = True,
                  overlap_setting: str = "kvpr-pipelined", layers=None, host_layers=None,
                  progress=None, min_seconds: float = 0.0) -> dict:
    """Time every setting at one point on the GPU, in turn (`time_in_turn`): {"rows": [...],
    "overlap": {...} or None}, the overlap: the stream spans of one step of `overlap_setting`
    (with keep_overlap; the result's "timelines" hold them, the CLI's --timeline-* flags pick
    them: recorded names).

    gpu_batches must divide batch (row schedules use 1). layers: the model's LayerWeights on the
    GPU (seeded random ones when None); they prefill the stores and, with weights="resident",
    run the steps (and HF's model shares them). host_layers: their HostLayers for
    weights="offloaded" (packed here when None). steps: timed rounds, at least. progress:
    called with (steps done, steps planned) after each step. min_seconds: time more rounds (up
    to MAX_STEPS) while a setting has been timed for less than this. cuda_graphs: the decoder's
    (and the profile's) layers as CUDA graphs, or eager.
    """
    _check_point(name, batch, context, schedule, gpu_batches, weights, steps, chunks, hf,
                 overlap_setting, min_seconds)
    model = MODELS[name]
    if layers is None:
        layers = random_layers(model, seed=0, dtype=torch.float16, device="cuda")
    if weights == "offloaded" and host_layers is None:
        host_layers = HostLayers(layers)
    stores = [HostStore(model, batch // gpu_batches, context + HEADROOM)
              for _ in range(gpu_batches)]
    for g, store in enumerate(stores):
        fill(store, layers, context, seed=1000 * g, device="cuda")
    # NOTE: after the fill: once, measured before it, as the last point's stores were being
    # freed, pinned H2D read 39 GB/s (55 in steady state)
    decoder = KVPRDecoder(model, layers if weights == "resident" else host_layers, stores, "cuda",
                          num_chunks=chunks, schedule=schedule, cuda_graphs=cuda_graphs)
    rates = profile(model, batch // gpu_batches, context, decoder=decoder)
    hidden = torch.randn(batch, model.hidden_size, dtype=torch.float16, device="cuda")
    shape = decoder.unit_shape(context)
    splits = {s: split_for(s, shape, rates, chunks) for s in SETTINGS}

    def kvpr_step(setting: str, record: bool = False) -> Callable[[], float]:
        def step() -> float:
            for store in stores:
                store.length = context  # every step from the same cached length
            decoder.record = record
            ms = 1e3 * timed_step(decoder, hidden, splits[setting])[1]
            torch.cuda.synchronize()  # the write-back too: steps do not overlap
            return ms
        return step

    steps_of = {setting: kvpr_step(setting) for setting in SETTINGS}
    if hf:
        steps_of[HF_SETTING] = HFSteps(model, layers, batch, context, context + HEADROOM)
    timings = time_in_turn(steps_of, steps, min_seconds, progress)
    steps_of.pop(HF_SETTING, None)  # HF's model and cache freed
    point = _point_fields(name, batch, context, schedule, gpu_batches, decoder, rates, shape,
                          cuda_graphs)
    rows, kept = [], None
    for setting, timing in timings.items():
        ms = statistics.median(timing["step_ms_runs"])
        row = {**point, "setting": setting, "step_ms": ms, **timing,
               "tokens_per_s": batch / (ms * 1e-3),
               "ratio_to_lower_bound": ms / point["lower_bound_ms"]}
        if setting == HF_SETTING:
            rows.append({**row, "l": None, **{f"predicted_{m}_ms": None for m in MODELS_OF_TIME},
                         "link_busy_ms": None, "compute_busy_ms": None, "overlap": None})
            continue
        l = splits[setting]
        kvpr_step(setting, record=True)()  # one more step, its stream spans recorded
        spans = decoder.last_spans.spans()
        rows.append({**row, "l": l,
                     **{f"predicted_{m}_ms": 1e3 * predicted_seconds(decoder, rates, l, context, m)
                        for m in MODELS_OF_TIME}, **overlap(spans)})
        if setting == overlap_setting and keep_overlap:
            kept = {key: point[key] for key in ("model", "batch", "context", "schedule",
                                                "gpu_batches", "weights")}
            kept.update(setting=setting, l=l, step_ms=ms, spans=spans)
    torch.cuda.empty_cache()
    return {"rows": rows, "overlap": kept}


def _check_point(name, batch, context, schedule, gpu_batches, weights, steps, chunks, hf,
                 overlap_setting, min_seconds) -> None:
    """ValueError, naming the value, for what `measure_point` cannot time; RuntimeError without
    a CUDA GPU."""
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
    if overlap_setting not in SETTINGS:
        raise ValueError(f"overlap_setting={overlap_setting!r}: must be one of {SETTINGS}")
    if not torch.cuda.is_available():
        raise RuntimeError("KVPR measurements need a CUDA GPU")


def _point_fields(name, batch, context, schedule, gpu_batches, decoder, rates, shape,
                  cuda_graphs) -> dict:
    """The fields every row of a point shares: the point, its measured rates, its lower bound."""
    lower_bound = lower_bound_seconds(shape, rates) * len(decoder.units())
    return {"model": name, "batch": batch, "context": context, "schedule": schedule,
            "gpu_batches": gpu_batches, "weights": decoder.weights, "cuda_graphs": cuda_graphs,
            "h2d_gbps": rates.h2d_bytes_per_s / 1e9, "d2h_gbps": rates.d2h_bytes_per_s / 1e9,
            "recompute_tflops": rates.recompute_flops_per_s / 1e12,
            "layer_ms": 1e3 * rates.layer_seconds, "unit_host_ms": 1e3 * rates.unit_host_seconds,
            "chunk_host_ms": 1e3 * rates.chunk_host_seconds,
            "lower_bound_ms": 1e3 * lower_bound}


def check_settings(steps: int, chunks: int, gpu_batches, min_seconds: float) -> None:
    """Raise ValueError, naming the value, unless the timing settings are usable."""
    check_positive_int("steps", steps)
    check_positive_int("chunks", chunks)
    for g in gpu_batches:
        check_positive_int("gpu_batches", g)
    if not (isinstance(min_seconds, (int, float)) and not isinstance(min_seconds, bool)
            and 0 <= min_seconds < float("inf")):
        raise ValueError(f"min_seconds={min_seconds!r}: must be a finite number >= 0")


POINT = ("model", "batch", "context", "schedule", "gpu_batches", "weights")
# What a resumed run must share with the result it continues.
TIMING = ("dtype", "steps", "chunks", "cuda_graphs", "min_seconds", "warmup_tolerance")


def _point(entry: dict) -> tuple:
    return tuple(entry[key] for key in POINT)


def _timing(args) -> dict:
    return {"dtype": "float16", "steps": args.steps, "chunks": args.chunks,
            "cuda_graphs": args.cuda_graphs, "min_seconds": args.min_seconds,
            "warmup_tolerance": WARMUP_TOLERANCE}


def previous_result(path: str, args, code: dict) -> dict:
    """The result or checkpoint at `path` that `args` resume: a kvpr result made by the same
    committed code (`code`: this run's `git_state`) and timed as `args` time (ValueError naming
    what differs)."""
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
    for key, value in _timing(args).items():
        if previous.get(key) != value:
            raise ValueError(f"--resume {path}: it was timed with {key}={previous.get(key)!r}, "
                             f"this run with {key}={value!r}; a resumed run must time the same "
                             "way")
    made_by = (previous.get("git_revision"), previous.get("git_dirty"))
    if code["git_revision"] is None or code["git_dirty"] is not False or made_by != (
            code["git_revision"], False):
        raise ValueError(
            f"--resume {path}: it was made by revision {made_by[0]} (dirty: {made_by[1]}), this "
            f"run is revision {code['git_revision']} (dirty: {code['git_dirty']}); a resumed run "
            "must run the same committed code")
    return previous


def check(args) -> None:
    """Raise ValueError for settings that cannot run together, without a GPU, or for a --resume
    file that this run cannot continue."""
    if args.hf and not ("row" in args.schedules and 1 in args.gpu_batches
                        and "resident" in args.weights):
        raise ValueError("--hf: HF's cache is compared with the row schedule, one GPU batch, "
                         "resident weights: add row, 1 and resident to the options")
    if not torch.cuda.is_available():
        raise ValueError("python -m kvlab bench kvpr needs a CUDA GPU")
    if args.resume:
        previous = previous_result(args.resume, args, git_state())
        gpu = torch.cuda.get_device_name(0)
        if previous["gpu"] != gpu:
            raise ValueError(f"--resume {args.resume}: measured on {previous['gpu']}, this GPU "
                             f"is {gpu}")


def run(args) -> dict:
    """The grid of `args` (checked by `check`)."""
    keep = set(args.timeline_points)
    result = {"benchmark": "kvpr", **run_info(), **gpu_info(), "command": args.command,
              **_timing(args), "timing": "CUDA events per step; every setting warm (two steps "
              "within 5%), then timed in turn, round by round; median",
              "rows": [], "timelines": [], "skipped": []}
    previous = previous_result(args.resume, args, result) if args.resume else None
    skipped = {}  # (point, setting or None) -> the entry; a later decision replaces one
    if previous is not None:
        result["rows"], result["timelines"] = previous["rows"], previous["timelines"]
        result["resumed_from"] = [*previous.get("resumed_from", []), {
            **{key: previous.get(key) for key in ("date", "git_revision", "command")},
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
        points = args.points or list(itertools.product(args.batches, args.contexts))
        for (batch, context), schedule, gpu_batches, weights in itertools.product(
                points, args.schedules, args.gpu_batches, args.weights):
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
                keep_overlap=(batch, context) in keep, overlap_setting=args.timeline_setting,
                layers=layers, host_layers=host_layers, min_seconds=args.min_seconds,
            )
            result["rows"] += point_result["rows"]
            if point_result["overlap"] is not None:  # "timelines": the recorded key
                result["timelines"].append(point_result["overlap"])
            result["skipped"] = list(skipped.values())
            write_checkpoint(args.checkpoint, result)
        del layers, host_layers
        torch.cuda.empty_cache()
    result["skipped"] = list(skipped.values())
    result["clocks_end"] = gpu_state()
    return result


def report(result: dict) -> str:
    """A line per row: the step's median ms, its ratio to the lower bound, and the speedup over
    full transfer and over HF's offloaded cache at the same point (three digits where a target
    is at stake); `*` marks a setting whose warm-up did not reach two steps within 5%."""
    lines = [f"{result['gpu']}: KVPR decode steps, median of >= {result['steps']} steps at "
             "steady state (* = not steady after the warm-up)",
             f"{'model':10} {'B':>3} {'ctx':>5} {'sched':8} {'weights':9} {'setting':15} "
             f"{'l':>5} {'ms':>9} {'tok/s':>7} {'xLB':>6} {'overlap':>7} {'vs full':>7} "
             f"{'vs HF':>7}"]
    by_point = {}
    for r in result["rows"]:
        by_point.setdefault(_point(r), {})[r["setting"]] = r["step_ms"]
    for r in result["rows"]:
        point = by_point[_point(r)]
        full, hf = point.get("full-transfer"), point.get(HF_SETTING)
        versus = [f"{base / r['step_ms']:.3f}x" if base and r["setting"] != HF_SETTING else "-"
                  for base in (full, hf)]
        split = "-" if r["l"] is None else r["l"]
        shared = "-" if r["overlap"] is None else f"{r['overlap']:.2f}"
        schedule = f"{r['schedule']}/{r['gpu_batches']}"
        steady = "" if r.get("steady", True) else "*"
        lines.append(f"{r['model']:10} {r['batch']:>3} {r['context']:>5} {schedule:8} "
                     f"{r['weights']:9} {r['setting'] + steady:15} {split:>5} "
                     f"{r['step_ms']:>9.2f} {r['tokens_per_s']:>7.0f} "
                     f"{r['ratio_to_lower_bound']:>6.3f} {shared:>7} {versus[0]:>7} "
                     f"{versus[1]:>7}")
    lines += [f"skipped {s['model']} B={s['batch']} ctx={s['context']} {s['schedule']}/"
              f"{s['gpu_batches']} {s['weights']}{' ' + s['setting'] if 'setting' in s else ''}: "
              f"{s['reason']}" for s in result["skipped"]]
    return "\n".join(lines)
