"""The L2 model (kvlab.sim) against the H200's counters and times:
`python benchmarks/l2_validation.py [--points 16x4096 1x32768] [--json PATH]`.

For every launch recorded by `bench counters` at the points given, the model replays the launch
as the kernels plan it (kvlab.sim.plan.launch_spec) and is set beside ncu's L2 hit rate and DRAM
bytes. The plan is the current code's: where a planner or a kernel's occupancy changed after
the counters were recorded (their git_revision), record them again before running this (a gqa
launch profiled in CTAs of other warps than the plan's, its kernel name's last template
argument, stops the run and says so). Where `bench attention --sms` timed the same launch
(results/h200/attention_sms.json, taken to be recorded by the current kernels: block 16, none /
bulk / line at distance 1), the model's time is set beside that time. The
launches (COUNTERS): four models, vllm_v1 and gqa, block 16, none and "bulk K+V d=1" on 132 / 80
/ 32 SMs (counters_sms.json); "line K+V d=1", "bulk K+V d=2" and "bulk K+V d=4" on the whole
GPU (counters_prefetch.json); block 32 (counters_block32.json). A launch recorded twice (each file
profiles its own no-prefetch launches) is checked once, from the first file.

Hit rate, two counters and two readings of the model for each (READINGS). The loads' own rate
(ncu: l2_read_hit_bytes / l2_read_bytes, the lookups of the SMs' loads in their own L2
partition): `near_hit_rate`, which knows the two partitions (kvlab.sim.l2), against
`hit_rate`, one cache. ncu's headline lts__t_sector_hit_rate (l2_hit_pct), which counts every
lookup: `ncu_hit_rate`, the prefetches' and the L2 fabric's lookups too, against
`lookup_hit_rate`, the prefetches' alone.

Time model (kvlab.sim.time_model), calibrated here on the no-prefetch launches of the whole GPU
(132 SMs) and checked on the rest (other SM counts, and prefetch): a launch takes the longer of
its DRAM bytes (the model's) over the copy roofline of its SM count (measured in the same
benchmark run) and the bytes its loads ask of the L2 over an L2 bandwidth per SM, divided by an
efficiency of its family, plus a fixed launch cost. The L2 bandwidth is fitted for both
families, the efficiency and launch cost per family (least squares on log time, grid search).
It has no term for what a prefetch costs the SM (instructions, issue slots): that it predicts
no prefetch loss is one of its findings.

Targets (the issue's): mean absolute hit-rate error <= 10 points (the loads' own rate,
`near_hit_rate`; counters before l2_read_hit_bytes gave only the headline); median relative
time error <= 15%, with at least 80% of points within 25%. Writes the rows and the summary as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlab.bench.env import run_info  # noqa: E402
from kvlab.kernels.prefetch import PrefetchConfig  # noqa: E402
from kvlab.results import load_result  # noqa: E402
from kvlab.sim import L2Cache, simulate  # noqa: E402
from kvlab.sim.l2 import SECTOR_BYTES  # noqa: E402
from kvlab.sim.plan import launch_spec  # noqa: E402
from kvlab.sim.time_model import TimeModel  # noqa: E402

# the model's reading -> the ncu column (model_row's) it answers; the first is the target's
READINGS = {"near_hit_rate": "ncu_load_hit_pct", "hit_rate": "ncu_load_hit_pct",
            "ncu_hit_rate": "ncu_hit_pct", "lookup_hit_rate": "ncu_hit_pct"}
TARGET_READING = "near_hit_rate"
COUNTERS = ("counters_sms", "counters_prefetch", "counters_block32")
LAUNCH = ("model", "kernel", "batch", "context", "block_size", "num_sms_used", "prefetch")
TARGETS = {"hit_mae_points": 10.0, "time_median_rel": 0.15, "time_within_25pct": 0.80}


def profiled_warps(launch: dict) -> int:
    """The warps of a CTA of a recorded launch (a counters row): gqa_decode's last template
    argument (WARPS); vllm_decode's CTAs are 4 warps."""
    if launch["kernel"] != "gqa":
        return 4
    name = launch["kernel_name"]
    return int(name[name.index("<") + 1:name.index(">(")].split(",")[-1])


def model_row(launch: dict) -> dict:
    """The model's answer for one recorded launch (a counters_sms row). Raises ValueError where
    the launch ran CTAs of other warps than the current plan's (the counters predate a change
    of the planner: record them again)."""
    spec = launch_spec(launch["model"], launch["kernel"], launch["batch"], launch["context"],
                       launch["num_sms_used"], PrefetchConfig.from_label(launch["prefetch"]),
                       block_size=launch["block_size"])
    if spec.warps != profiled_warps(launch):
        raise ValueError(
            f"{launch['model']} {launch['kernel']} {launch['batch']}x{launch['context']} on "
            f"{launch['num_sms_used']} SMs was profiled in CTAs of {profiled_warps(launch)} "
            f"warps; the current plan runs {spec.warps}: record the counters again "
            "(python -m kvlab bench counters)")
    result = simulate(spec, L2Cache())
    return {**{k: launch[k] for k in ("model", "kernel", "batch", "context", "block_size",
                                      "prefetch")},
            "sms": launch["num_sms_used"], "partition_size": spec.partition_size,
            "warps": spec.warps,
            "ncu_hit_pct": launch["l2_hit_pct"],
            # recorded since revision af1c220; None in counters before it
            "ncu_load_hit_pct": 100 * launch["l2_read_hit_bytes"] / launch["l2_read_bytes"]
            if "l2_read_hit_bytes" in launch else None,
            "ncu_dram_bytes": launch["dram_read_bytes"],
            **{f"model_{r}_pct": 100 * getattr(result, r) for r in READINGS},
            "model_dram_bytes": result.dram_bytes,
            "model_load_bytes": result.demand_sectors * SECTOR_BYTES}


def measured_ms(attention: dict) -> dict:
    return {(r["model"], r["kernel"], r["batch"], r["context"], r["block_size"], r["sms"],
             r["prefetch"]): r["ms"] for r in attention["rows"]}


def group(row: dict) -> str:
    """The summary's group of a model_row: kernel, SMs, prefetch (and a block size not 16)."""
    block = "" if row["block_size"] == 16 else f", block {row['block_size']}"
    return f"{row['kernel']}, {row['sms']} SMs, {row['prefetch']}{block}"


def predict_ms(row: dict, roofline: dict, efficiency: float, l2_gbps_per_sm: float,
               launch_us: float) -> float:
    """kvlab.sim.time_model's time for a model_row with these constants."""
    model = TimeModel(l2_gbps_per_sm, {row["kernel"]: efficiency}, {row["kernel"]: launch_us})
    return model.predict_ms(row["kernel"], row["model_dram_bytes"], row["model_load_bytes"],
                            row["sms"], roofline[row["sms"]])


def fit(rows: list[dict], roofline: dict) -> dict:
    """The time model's parameters minimising the squared log error over `rows`: one L2
    bandwidth per SM for both families (a property of the GPU), an efficiency and a launch cost
    per family: {"l2_gbps_per_sm": ..., family: {"efficiency": ..., "launch_us": ...}}."""
    def error(rows, *p):
        return sum(math.log(predict_ms(r, roofline, *p) / r["ms"]) ** 2 for r in rows)

    families = sorted({r["kernel"] for r in rows})
    best = None
    for l2 in (10.0 * 1.1 ** k for k in range(40)):
        own = {}
        for family in families:
            mine = [r for r in rows if r["kernel"] == family]
            own[family] = min(itertools.product([e / 100 for e in range(50, 121, 2)],
                                                [float(u) for u in range(0, 21, 2)]),
                              key=lambda p, mine=mine, l2=l2: error(mine, p[0], l2, p[1]))
        total = sum(error([r for r in rows if r["kernel"] == f], own[f][0], l2, own[f][1])
                    for f in families)
        if best is None or total < best[0]:
            best = (total, l2, own)
    _, l2, own = best
    return {"l2_gbps_per_sm": l2, **{f: {"efficiency": e, "launch_us": u}
                                     for f, (e, u) in own.items()}}


def hit_error(row: dict, reading: str = TARGET_READING) -> float | None:
    """The model's `reading` against the ncu column it answers, in points (None where the
    counters lack that column)."""
    measured = row[READINGS[reading]]
    return None if measured is None else abs(row[f"model_{reading}_pct"] - measured)


def hit_mae(rows: list[dict], reading: str = TARGET_READING) -> float | None:
    """The mean of `hit_error` over the rows whose counters answer `reading` (None if none)."""
    errors = [e for e in (hit_error(r, reading) for r in rows) if e is not None]
    return statistics.fmean(errors) if errors else None


def summarise(rows: list[dict]) -> dict:
    hits = {r: hit_mae(rows, r) for r in READINGS}
    timed = [r for r in rows if r.get("predicted_ms") is not None and not r["fitted"]]
    errors = [abs(r["predicted_ms"] / r["ms"] - 1) for r in timed]
    groups = {}
    for r in rows:
        groups.setdefault(group(r), []).append(r)
    by_group = {name: {
        "hit_mae_points": hit_mae(mine),
        "headline_hit_mae_points": hit_mae(mine, "ncu_hit_rate"),
        # over the group's timed launches (a launch timed as other than profiled is not)
        "time_median_rel": statistics.median(abs(r["predicted_ms"] / r["ms"] - 1)
                                             for r in mine if r.get("predicted_ms"))
        if any(r.get("predicted_ms") for r in mine) else None} for name, mine in groups.items()}
    return {"configs": len(rows), "hit_mae_points": hits, "by_group": by_group,
            "time_checked": len(timed),
            "time_median_rel": statistics.median(errors) if errors else None,
            "time_within_25pct": sum(e <= 0.25 for e in errors) / len(errors) if errors else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=["16x4096", "1x32768"],
                        help="BATCHxCONTEXT points of the counters to check")
    parser.add_argument("--json", metavar="PATH", help="write the rows and summary as JSON")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    counters = {name: load_result("h200", name) for name in COUNTERS}
    attention = load_result("h200", "attention_sms")
    launches = {}
    for result in counters.values():
        for r in result["rows"]:
            if f"{r['batch']}x{r['context']}" in args.points:
                launches.setdefault(tuple(r[k] for k in LAUNCH), r)
    launches = list(launches.values())
    if not launches:
        parser.error(f"--points {' '.join(args.points)}: none recorded in {COUNTERS}")
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(model_row, launches))
    times = measured_ms(attention)
    whole = attention["num_sms"]  # the GPU's SMs: the whole-GPU roofline and the fitted launches
    roofline = {whole: attention["roofline_copy_gbps"],
                **{int(k): v for k, v in attention["roofline_copy_gbps_by_sms"].items()}}
    for row in rows:
        row["ms"] = times.get((row["model"], row["kernel"], row["batch"], row["context"],
                               row["block_size"], row["sms"], row["prefetch"]))
        row["fitted"] = row["sms"] == whole and row["prefetch"] == "none"
    params = fit([r for r in rows if r["fitted"] and r["ms"] is not None], roofline)
    for r in rows:
        if r["ms"] is not None:
            own = params[r["kernel"]]
            r["predicted_ms"] = predict_ms(r, roofline, own["efficiency"],
                                           params["l2_gbps_per_sm"], own["launch_us"])
    result = {"benchmark": "l2_validation", **run_info(), "command": " ".join(
        ["python benchmarks/l2_validation.py", *(argv if argv is not None else sys.argv[1:])]),
        "counters": {name: {k: c[k] for k in ("date", "gpu", "git_revision")}
                     for name, c in counters.items()},
        "attention": {k: attention[k] for k in ("date", "gpu", "git_revision")},
        "cache": {"fill_latency_rounds": L2Cache().fill_latency_rounds},
        "time_model": params, "targets": TARGETS, "summary": summarise(rows), "rows": rows}
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def points(value: float | None) -> str:
    return "   n/a" if value is None else f"{value:6.1f}"


def report(result: dict) -> str:
    lines = [f"{'model':12} {'kernel':7} {'point':8} {'SMs':>3} {'prefetch':13} {'loads':>6} "
             f"{'all':>6} " + " ".join(f"{r[:14]:>14}" for r in READINGS)
             + f" {'ms':>8} {'model ms':>8}"]
    for r in result["rows"]:
        lines.append(
            f"{r['model']:12} {r['kernel']:7} {r['batch']}x{r['context']:<5} {r['sms']:>3} "
            f"{r['prefetch']:13} {points(r['ncu_load_hit_pct'])} {r['ncu_hit_pct']:6.1f} "
            + " ".join(f"{r[f'model_{k}_pct']:14.1f}" for k in READINGS)
            + (f" {r['ms']:8.4f} {r['predicted_ms']:8.4f}" if r.get("predicted_ms") else ""))
    s = result["summary"]
    lines.append(f"{s['configs']} launches; hit-rate MAE (points): " + ", ".join(
        f"{k} {points(v).strip()}" for k, v in s["hit_mae_points"].items()))
    lines += [f"  {name}: hit MAE {points(g['hit_mae_points']).strip()} points (loads), time "
              f"median error {100 * g['time_median_rel']:.1f}%" for name, g in s["by_group"].items()
              if g["time_median_rel"] is not None]
    if s["time_median_rel"] is not None:
        lines.append(f"time, {s['time_checked']} launches not fitted: median error "
                     f"{100 * s['time_median_rel']:.1f}%, within 25%: "
                     f"{100 * s['time_within_25pct']:.0f}%; fit {result['time_model']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
