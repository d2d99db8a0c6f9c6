"""How fast the L2 model runs on one CPU core: `python -m kvlab bench l2sim`.

Two rates, each the median of several repeats on one pinned core (every repeat is recorded), CPU
time (time.process_time: one core's work, less sensitive than wall time to other processes, not
insensitive: on a shared host, memory contention still shows), JIT compilation kept out:
- the cache alone (`L2Cache.access`) on whole 4 KiB tiles at random addresses of a 1 GiB pool
  (nearly every sector misses: its slowest path);
- the whole of `simulate` (trace generation included) on one Llama-2-7B decode step, 16
  sequences x 4,096 tokens, 32:32 heads (1 GiB of K and V).
The target: at least 20 million sector accesses per second.
"""

import dataclasses
import statistics
import time

import numpy as np

from kvlab.bench.env import pin_to_one_core, run_info
from kvlab.sim import L2Cache, TraceSpec, simulate
from kvlab.sim.l2 import DEMAND, SECTOR_BYTES

TARGET_SECTORS_PER_S = 20e6
TILE_BYTES = 16 * 128 * 2  # one (block, KV head) tile: block 16, head_dim 128, fp16
POOL_BYTES = 1 << 30
LLAMA2_7B_16X4K = TraceSpec(family="vllm_v1", num_seqs=16, context=4096, num_qo_heads=32,
                            num_kv_heads=32, partition_size=0, ctas_per_sm=4)


def cache_rate(num_sectors: int, seed: int = 0) -> float:
    """Sector accesses per CPU second of L2Cache.access (H200 geometry): `num_sectors` sectors
    of demand reads, as whole tiles at random tile addresses of a 1 GiB pool."""
    num_tiles = num_sectors // (TILE_BYTES // SECTOR_BYTES)
    rng = np.random.default_rng(seed)
    addrs = rng.integers(0, POOL_BYTES // TILE_BYTES, num_tiles, dtype=np.int64) * TILE_BYTES
    nbytes = np.full(num_tiles, TILE_BYTES, dtype=np.int64)
    kinds = np.full(num_tiles, DEMAND, dtype=np.uint8)
    L2Cache().access(addrs[:1], nbytes[:1], kinds[:1])  # compiles (or loads the cached code)
    cache = L2Cache()
    start = time.process_time()
    result = cache.access(addrs, nbytes, kinds)
    return result.demand_sectors / (time.process_time() - start)


def simulate_rate(spec: TraceSpec) -> float:
    """Sector accesses (loads and prefetches) per CPU second of `simulate(spec)`."""
    simulate(dataclasses.replace(spec, num_seqs=1, context=64))  # compiles
    start = time.process_time()
    result = simulate(spec)
    return (result.demand_sectors + result.prefetch_sectors) / (time.process_time() - start)


def check(args) -> None:
    """Nothing to check beyond the options: it runs on any CPU."""


def run(args) -> dict:
    num_repeats = 3 if args.quick else 7
    num_sectors = 1 << (22 if args.quick else 25)
    spec = (dataclasses.replace(LLAMA2_7B_16X4K, num_seqs=2) if args.quick
            else LLAMA2_7B_16X4K)
    core = pin_to_one_core()
    cache_runs = [round(cache_rate(num_sectors, seed)) for seed in range(num_repeats)]
    whole_runs = [round(simulate_rate(spec)) for _ in range(num_repeats)]
    cache, whole = statistics.median(cache_runs), statistics.median(whole_runs)
    return {"benchmark": "l2sim", **run_info(), "core": core, "num_repeats": num_repeats,
            "cache_runs": cache_runs, "simulate_runs": whole_runs,
            "cache_sectors": num_sectors, "simulate_spec": dataclasses.asdict(spec) | {
                "prefetch": spec.prefetch.label()},
            "cache_sectors_per_s": round(cache), "simulate_sectors_per_s": round(whole),
            "target_sectors_per_s": TARGET_SECTORS_PER_S,
            "meets_target": min(cache, whole) >= TARGET_SECTORS_PER_S}


def report(result: dict) -> str:
    verdict = "meets" if result["meets_target"] else "MISSES"
    cache, whole = (result[k] / 1e6 for k in ("cache_sectors_per_s", "simulate_sectors_per_s"))
    spread = {k: f"({min(result[k]) / 1e6:.1f}-{max(result[k]) / 1e6:.1f})"
              for k in ("cache_runs", "simulate_runs")}
    return "\n".join([
        f"L2 model on one core (core {result['core']}, {result['cpu']}), median (range) of "
        f"{result['num_repeats']} repeats, CPU time:",
        f"  L2Cache.access (random tiles, misses)  {cache:>7.1f} M sector accesses/s "
        f"{spread['cache_runs']}",
        f"  simulate (Llama-2-7B decode step)      {whole:>7.1f} M sector accesses/s "
        f"{spread['simulate_runs']}",
        f"  {verdict} the {result['target_sectors_per_s'] / 1e6:.0f} M/s target",
    ])
