"""The L2-prefetch paper's Table 5.2 on this GPU: `python -m kvlab bench counters`.

For each model (default: the paper's four), kernel family (vllm_v1, gqa), BATCHxCONTEXT point and
SM count (--sms: on a CUDA green context; default the whole GPU), Nsight Compute profiles one
launch of the decode kernel without prefetch and with each --prefetch setting
(`kvlab.profile.counters`: L2 flushed before the launch, clocks left to the GPU; vllm_v1's reduce
and gqa's merge kernels are not included). `rows`: every launch's counters. `table`: Table 5.2 on
this GPU: at each point and prefetch setting, each of the paper's rows with our values without
and with prefetch, the paper's H20 figures for the model beside them (`kvlab.profile.paper`), and
ours / paper. The speedup row is the ratio of ncu's two durations, one launch each: a counter
run, not a timing benchmark (`bench attention` times the kernels).
The paper states no batch or context for its table, so the points are ours (--points).
All launches are profiled in one ncu run (one process: start-up and compiling paid once). Where it
gives no whole row (timeout, a failed process, output it cannot parse), each point runs on its
own and a point that still fails is skipped with the reason; ncu missing or refusing the counters
ends the run.
"""

from __future__ import annotations

import itertools
import shutil
import sys
from dataclasses import asdict, replace

from kvlab.bench.env import gpu_info, gpu_state, run_info
from kvlab.profile import CountersError, KernelSpec, measure_many, ncu, paper

FATAL = ("not_found", "refused")  # CountersError reasons that no other launch would escape
POINT = ("model", "kernel", "batch", "context", "block_size", "num_sms")


def settings(args) -> list[tuple[str, list[KernelSpec]]]:
    """The launches to profile, point by point: (model, [its spec without prefetch, then one per
    --prefetch label]). Raises ValueError for a shape the kernels cannot run."""
    groups = []
    for name, family, (batch, context), num_sms in itertools.product(
            args.models, args.families, args.points, args.sms or [None]):
        base = KernelSpec.for_model(name, family, "none", batch=batch, context=context,
                                    block_size=args.block_size, num_sms=num_sms)
        groups.append((name, [base] + [replace(base, prefetch=p) for p in args.prefetch]))
    return groups


def check(args) -> None:
    """Raise ValueError for a launch the kernels cannot run, or without a CUDA GPU, ncu, or the
    SMs --sms asks for."""
    settings(args)
    import torch

    if not torch.cuda.is_available():
        raise ValueError("python -m kvlab bench counters needs a CUDA GPU")
    if shutil.which("ncu") is None:
        raise ValueError("python -m kvlab bench counters needs Nsight Compute: ncu not found on "
                         "PATH")
    total = torch.cuda.get_device_properties(0).multi_processor_count
    for n in args.sms or ():
        if n > total:
            raise ValueError(f"--sms {n}: this GPU has {total} SMs")


def run(args) -> dict:
    """Profile every launch of `settings(args)` (checked by `check`): all in one ncu run; where
    that run gives no whole row (a non-fatal CountersError), each point in a run of its own, so
    that only the points that fail are skipped, with their reason."""
    groups = settings(args)
    launches = [(name, spec) for name, specs in groups for spec in specs]
    cmd = ncu.command([spec for _, spec in launches])
    result = {"benchmark": "counters", **run_info(), **gpu_info(), "command": args.command,
              "ncu": ncu.version(), "ncu_options": cmd[1:cmd.index(sys.executable)],
              "metrics": {column: metric for column, (metric, _) in ncu.METRICS.items()},
              "dtype": "float16", "timeout_s": args.timeout, "paper": paper.SOURCE,
              "rows": [], "skipped": []}
    print(f"{len(launches)} launches in one ncu run", file=sys.stderr)
    try:
        rows = measure_many([spec for _, spec in launches],
                            timeout_s=args.timeout * len(launches))
        result["rows"] = [{"model": name, **row}
                          for (name, _), row in zip(launches, rows, strict=True)]
    except CountersError as err:
        if err.reason in FATAL:
            raise
        print(f"{err}; now point by point", file=sys.stderr)
        for name, specs in groups:
            try:
                rows = measure_many(specs, timeout_s=args.timeout * len(specs))
                result["rows"] += [{"model": name, **row} for row in rows]
            except CountersError as point_err:
                if point_err.reason in FATAL:
                    raise
                result["skipped"] += [{"model": name, **asdict(spec), "reason": str(point_err)}
                                      for spec in specs]
    result["table"] = table(result["rows"])
    result["clocks_end"] = gpu_state()
    return result


def _ratio(ours: float, theirs: float | None) -> float | None:
    return None if theirs is None else ours / theirs


def table(rows: list[dict]) -> list[dict]:
    """Table 5.2 from measured rows (`run`'s): for each row with prefetch whose baseline (same
    POINT, prefetch "none") was measured, one entry per row of the paper (paper.ROWS): our
    value without and with prefetch ("ours_baseline", "ours_prefetch"), the paper's for the model
    ("paper_*"; None for a model it lacks) and ours / paper ("ratio_*"); then the speedup entry:
    our baseline duration over the prefetch one, beside the paper's speedup (prefetch columns
    only)."""
    baselines = {tuple(r[k] for k in POINT): r for r in rows if r["prefetch"] == "none"}
    entries = []
    for r in rows:
        base = baselines.get(tuple(r[k] for k in POINT))
        if r["prefetch"] == "none" or base is None:
            continue
        where = {**{k: r[k] for k in POINT}, "num_sms_used": r["num_sms_used"],
                 "prefetch": r["prefetch"]}
        for column, name in paper.ROWS.items():
            theirs = paper.TABLE_5_2[column].get(r["model"], (None, None))
            entries.append({**where, "row": name, "column": column,
                            "ours_baseline": base[column], "paper_baseline": theirs[0],
                            "ratio_baseline": _ratio(base[column], theirs[0]),
                            "ours_prefetch": r[column], "paper_prefetch": theirs[1],
                            "ratio_prefetch": _ratio(r[column], theirs[1])})
        speedup, theirs = base["duration_us"] / r["duration_us"], paper.SPEEDUP.get(r["model"])
        entries.append({**where, "row": paper.SPEEDUP_ROW, "column": "speedup",
                        "ours_baseline": None, "paper_baseline": None, "ratio_baseline": None,
                        "ours_prefetch": speedup, "paper_prefetch": theirs,
                        "ratio_prefetch": _ratio(speedup, theirs)})
    return entries


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(result: dict) -> str:
    """A line per entry of the table: ours and the paper's H20 figure without prefetch, then with
    it, each with ours / paper; then the launches skipped."""
    lines = [f"{result['gpu']}: ncu counters of one decode launch ({result['ncu']}; L2 flushed, "
             f"clocks not locked) beside {paper.GPU}'s in the paper; ratio = ours / paper",
             f"{'model':12} {'kernel':7} {'B':>4} {'ctx':>6} {'SMs':>4} {'prefetch':14} "
             f"{'counter':22} {'ours':>8} {'H20':>8} {'ratio':>6} {'ours pf':>8} "
             f"{'H20 pf':>8} {'ratio':>6}"]
    for e in result["table"]:
        lines.append(
            f"{e['model']:12} {e['kernel']:7} {e['batch']:>4} {e['context']:>6} "
            f"{e['num_sms_used']:>4} {e['prefetch']:14} {e['column']:22} "
            + " ".join(f"{_number(e[key]):>{width}}" for key, width in (
                ("ours_baseline", 8), ("paper_baseline", 8), ("ratio_baseline", 6),
                ("ours_prefetch", 8), ("paper_prefetch", 8), ("ratio_prefetch", 6))))
    lines += [f"skipped {s['model']} {s['kernel']} B={s['batch']} ctx={s['context']} "
              f"sms={s['num_sms'] or 'all'} prefetch={s['prefetch']}: {s['reason']}"
              for s in result["skipped"]]
    return "\n".join(lines)
