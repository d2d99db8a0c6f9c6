"""Block pool throughput: allocate+free pairs per second on one core.

Each timed repeat runs `num_pairs` calls of `allocate(n)` followed by `free(those blocks)` on a pool
that is half full (so the free queue wraps as in a running server), and reports the median repeat.
"""

import statistics
import time

from kvlab.bench.env import pin_to_one_core, run_info
from kvlab.cache import BlockManager, BlockPool

TARGET_PAIRS_PER_S = 500_000


def _time_pool_pairs(blocks_per_call: int, num_pairs: int, num_repeats: int) -> float:
    pool = BlockPool(num_blocks=65536, block_size=16)
    pool.allocate(32768)  # live sequences elsewhere in the pool
    allocate, free = pool.allocate, pool.free
    rates = []
    for _ in range(num_repeats):
        start = time.perf_counter()
        for _ in range(num_pairs):
            free(allocate(blocks_per_call))
        rates.append(num_pairs * blocks_per_call / (time.perf_counter() - start))
    return statistics.median(rates)


def _time_sequences(num_seqs: int, seq_len: int, num_repeats: int) -> float:
    """add_sequence + free of whole sequences per second (block tables, no prefix sharing)."""
    manager = BlockManager(num_blocks=num_seqs * (seq_len // 16 + 1), block_size=16)
    rates = []
    for _ in range(num_repeats):
        start = time.perf_counter()
        seq_ids = [manager.add_sequence(seq_len).seq_id for _ in range(num_seqs)]
        for seq_id in seq_ids:
            manager.free(seq_id)
        rates.append(num_seqs / (time.perf_counter() - start))
    return statistics.median(rates)


def check(args) -> None:
    """Nothing to check beyond the options: it runs on any CPU."""


def run(args) -> dict:
    num_pairs, num_repeats = (20_000, 3) if args.quick else (200_000, 7)
    core = pin_to_one_core()
    single = _time_pool_pairs(1, num_pairs, num_repeats)
    batched = _time_pool_pairs(16, num_pairs // 16, num_repeats)
    seqs = _time_sequences(num_seqs=2048, seq_len=1000, num_repeats=num_repeats)
    return {
        "benchmark": "cache",
        **run_info(),
        "core": core,
        "num_pairs": num_pairs,
        "num_repeats": num_repeats,
        "pool_pairs_per_s": round(single),
        "pool_pairs_per_s_16_per_call": round(batched),
        "sequences_per_s_1000_tokens": round(seqs),
        "target_pairs_per_s": TARGET_PAIRS_PER_S,
        "meets_target": single >= TARGET_PAIRS_PER_S,
    }


def report(result: dict) -> str:
    verdict = "meets" if result["meets_target"] else "MISSES"
    return "\n".join([
        f"BlockPool on one core (core {result['core']}, {result['cpu']}), "
        f"median of {result['num_repeats']} repeats:",
        f"  allocate(1) + free          {result['pool_pairs_per_s']:>12,} pairs/s  "
        f"({verdict} the {result['target_pairs_per_s']:,}/s target)",
        f"  allocate(16) + free         {result['pool_pairs_per_s_16_per_call']:>12,} blocks/s",
        f"  add_sequence(1000) + free   {result['sequences_per_s_1000_tokens']:>12,} sequences/s",
    ])
