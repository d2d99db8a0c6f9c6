"""`kernel="auto"`: the kernel family that reads the cache's layout, with the prefetch setting that
gained most over no prefetch in the recorded H200 benchmark for the nearest recorded shape.

Nearest shape: the recorded model with the closest GQA group (then KV head count), the closest
block size, then the closest (batch, context) on a log2 scale (`kvlab.results.nearest_point`).
"""

import functools
import math

from kvlab import results
from kvlab.kernels.prefetch import PrefetchConfig


@functools.cache
def recorded_rows() -> tuple[dict, ...]:
    try:
        return tuple(results.load_results(*results.ATTENTION)["rows"])
    except ValueError:  # nothing recorded in this installation
        return ()


def _log_distance(a: int, b: int) -> float:
    return abs(math.log2(a / b))


def best_prefetch(kernel: str, num_qo_heads: int, num_kv_heads: int, block_size: int,
                  batch: int, context: int) -> PrefetchConfig:
    """The recorded fastest prefetch setting of `kernel` nearest to this shape; no prefetch when
    nothing is recorded for `kernel`."""
    rows = [r for r in recorded_rows() if r["kernel"] == kernel]
    if not rows:
        return PrefetchConfig()
    group = num_qo_heads // num_kv_heads

    def model_distance(row):
        row_group = row["num_qo_heads"] // row["num_kv_heads"]
        return (_log_distance(row_group, group), _log_distance(row["num_kv_heads"], num_kv_heads))

    model = min(rows, key=model_distance)["model"]
    rows = [r for r in rows if r["model"] == model]
    nearest_block = min({r["block_size"] for r in rows},
                        key=lambda b: (_log_distance(b, block_size), b))
    rows = [r for r in rows if r["block_size"] == nearest_block]
    point = results.nearest_point({"rows": rows}, model, batch, context)
    at_point = [r for r in rows if (r["batch"], r["context"]) == point]
    # NOTE: speedups over the no-prefetch run of the same recording, not raw times across runs.
    best, speedup = max(results.speedups(at_point), key=lambda pair: pair[1])
    return PrefetchConfig.from_label(best["prefetch"] if speedup > 1 else "none")
