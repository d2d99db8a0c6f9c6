"""What the model says about the L2-prefetch paper's H20 (arXiv 2504.06319, Table 5.2 and its
1.84-2.15x kernel speedups), beside the published figures (kvlab.profile.paper).

The paper's baseline is vLLM's PagedAttention (its XFormers backend), the design kvlab's
`vllm_v1` repeats; its prefetch is a bulk L2 prefetch of the next K and V tiles, one warp
stride ahead ("bulk K+V d=1"). The paper states no batch or context for the table: the model is
asked at the lab's point (POINT, as benchmarks/README's reproduction), and for the speedup also
at every point of GRID, its largest kept. Kernel speedup and memory throughput come from the
closed form (kvlab.predict.decode_launch on the "h20" of kvlab.gpus, whose copy roofline, SM and
L2 rates are assumptions); the L2 hit rate from the L2 model's replay (kvlab.sim) of the same
launch on the H20's SMs and L2, read as ncu's headline counter reads it (`replay`). Stalls, CPI
and compute throughput are not modelled.
"""

from __future__ import annotations

from kvlab.predict.decode import decode_launch

GPU = "h20"
POINT = (16, 4096)  # (batch, context): the paper gives none; the lab's Table 5.2 point
PREFETCH = "bulk K+V d=1"  # the paper's Algorithm 1, on K and V
GRID = [(b, c) for b in (1, 4, 16, 64, 128, 256) for c in (1024, 4096, 8192, 32768)]
FAMILY = "vllm_v1"


def replay(model: str, prefetch: str, point=POINT, gpu_key: str = GPU) -> dict:
    """The L2 model's replay of vllm_v1's launch for `model` at `point` with `prefetch` on
    `gpu_key`'s SMs and an L2 of its size (16 ways, as the H200's model): {"ncu_hit_pct",
    "near_hit_pct", "dram_bytes"}. Seconds of CPU (Numba)."""
    from kvlab.gpus import gpu
    from kvlab.kernels.prefetch import PrefetchConfig
    from kvlab.sim import L2Cache, simulate
    from kvlab.sim.l2 import LINE_BYTES, NUM_WAYS
    from kvlab.sim.plan import launch_spec

    g = gpu(gpu_key)
    spec = launch_spec(model, FAMILY, *point, g.num_sms, PrefetchConfig.from_label(prefetch))
    result = simulate(spec, L2Cache(num_sets=g.l2_bytes // (LINE_BYTES * NUM_WAYS)))
    return {"ncu_hit_pct": round(100 * result.ncu_hit_rate, 2),
            "near_hit_pct": round(100 * result.near_hit_rate, 2),
            "dram_bytes": int(result.dram_bytes)}


def replays() -> dict:
    """{model: {"none" | PREFETCH: `replay`}} for the paper's four models."""
    from kvlab.profile import paper

    return {m: {p: replay(m, p) for p in ("none", PREFETCH)} for m in paper.MODELS}


def recorded_speedups() -> dict[str, list[float]]:
    """{SMs: [lowest, median, highest]} of vllm_v1's measured speedup with PREFETCH over none, in
    the same loop, on the H200's green contexts (results/h200/attention_sms.json): the lift the
    model has seen."""
    import statistics

    from kvlab.predict.recorded import MACHINE
    from kvlab.results import load_recorded, speedups

    result = load_recorded(MACHINE, ["attention_sms"])
    by_sms: dict[str, list[float]] = {}
    for row, gain in speedups(result["rows"]) if result else ():
        if row["kernel"] == FAMILY and row["prefetch"] == PREFETCH:
            by_sms.setdefault(str(row["sms"]), []).append(gain)
    return {sms: [round(min(g), 3), round(statistics.median(g), 3), round(max(g), 3)]
            for sms, g in sorted(by_sms.items(), key=lambda item: -int(item[0]))}


def speedup(model: str, batch: int, context: int) -> float:
    """The closed form's time without prefetch over the time with PREFETCH, vllm_v1 on the H20."""
    times = [decode_launch(model, batch, context, family=FAMILY, prefetch=p, gpu=GPU).time_ms
             for p in ("none", PREFETCH)]
    return times[0] / times[1]


def memory_pct(model: str, prefetch: str, point=POINT) -> float:
    """DRAM throughput, % of the H20's published bandwidth: K+V once over the closed form's
    time (ncu read K+V once, within 2%, for vllm_v1 without prefetch on the H200:
    results/h200/counters*.json)."""
    from kvlab.gpus import gpu

    answer = decode_launch(model, *point, family=FAMILY, prefetch=prefetch, gpu=GPU)
    return 100 * answer.gbps / gpu(GPU).hbm_gbps


def rows(replayed: dict) -> list[dict]:
    """Per paper model: the published figures beside the model's ("metric", "model",
    "published": (baseline, prefetch) or a speedup, "predicted": the same or None where not
    modelled, "how"). `replayed`: `replays()`'s answer (as predict.json keeps it)."""
    from kvlab.profile import paper

    found = []
    for m in paper.MODELS:
        best = max(GRID, key=lambda p, m=m: _speedup_or_zero(m, *p))
        found += [
            {"metric": "kernel speedup", "model": m, "published": paper.SPEEDUP[m],
             "predicted": round(speedup(m, *POINT), 3), "how": "closed form at 16 x 4k"},
            {"metric": "kernel speedup, best point", "model": m, "published": paper.SPEEDUP[m],
             "predicted": round(speedup(m, *best), 3),
             "how": f"closed form, largest over the grid: at {best[0]} x {best[1] // 1024}k"},
            {"metric": "L2 hit rate, %", "model": m,
             "published": paper.TABLE_5_2["l2_hit_pct"][m],
             "predicted": tuple(replayed[m][p]["ncu_hit_pct"] for p in ("none", PREFETCH)),
             "how": "L2 replay at 16 x 4k, ncu's headline reading"},
            {"metric": "memory throughput, %", "model": m,
             "published": paper.TABLE_5_2["memory_throughput_pct"][m],
             "predicted": tuple(round(memory_pct(m, p), 1) for p in ("none", PREFETCH)),
             "how": "closed form: DRAM GB/s over the H20's 4.0 TB/s"},
        ]
        found += [{"metric": name, "model": m, "published": paper.TABLE_5_2[column][m],
                   "predicted": None, "how": "not modelled"}
                  for column, name in (("long_scoreboard_cycles", "long-scoreboard stall, "
                                        "cycles/inst"), ("cpi", "CPI"),
                                       ("sm_throughput_pct", "compute throughput, %"))]
    return found


def _speedup_or_zero(model: str, batch: int, context: int) -> float:
    """`speedup`, or 0 where the point's K and V do not fit the H20."""
    try:
        return speedup(model, batch, context)
    except ValueError:
        return 0.0
