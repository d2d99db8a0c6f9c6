"""`kernel="auto"` without measuring (KVLAB_AUTOTUNE=0, graph capture; see kvlab.kernels.tune): the
prefetch setting that gained most, in the worst case, over no prefetch in the recorded H200
benchmark around the shape.

Nearest shape: the recorded model with the closest GQA group (then KV head count) and the closest
block size. Around the requested (batch, context) it takes the recorded batches and contexts just
below and above, and picks the setting whose smallest gain over those points is largest: a setting
that won at batch 16 but lost at batch 64 is not used at batch 32.
"""

import functools
import math

from kvlab import results
from kvlab.checks import check_block_size, check_num_heads, check_positive_int
from kvlab.kernels.prefetch import PrefetchConfig


@functools.cache
def recorded_rows() -> tuple[dict, ...]:
    try:
        return tuple(results.load_results(*results.ATTENTION)["rows"])
    except ValueError:  # nothing recorded in this installation
        return ()


def _log_distance(a: int, b: int) -> float:
    return abs(math.log2(a / b))


def _bracket(value: int, recorded: set[int]) -> set[int]:
    """The recorded values just below and just above `value` (one if it is recorded or outside)."""
    below = [v for v in recorded if v <= value]
    above = [v for v in recorded if v >= value]
    return {max(below) if below else min(above), min(above) if above else max(below)}


def best_prefetch(kernel: str, num_qo_heads: int, num_kv_heads: int, block_size: int,
                  batch: int, context: int) -> PrefetchConfig:
    """The prefetch setting of `kernel` with the largest worst-case recorded gain over no
    prefetch at the recorded (batch, context) points around this shape; no prefetch unless
    that worst case is a gain, or when nothing is recorded for `kernel`. ValueError for a shape
    no plan has (head counts, block size, batch and context not positive integers)."""
    check_num_heads(num_qo_heads, num_kv_heads)
    check_block_size(block_size)
    check_positive_int("batch", batch)
    check_positive_int("context", context)
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
    points = {(b, c) for b in _bracket(batch, {r["batch"] for r in rows})
              for c in _bracket(context, {r["context"] for r in rows})}
    # NOTE: gains over the no-prefetch run of the same recording, not raw times across runs;
    # where several recordings measured a setting at a point, the smallest gain counts.
    gains: dict[str, dict[tuple, float]] = {}
    for row, gain in results.speedups([r for r in rows if (r["batch"], r["context"]) in points]):
        at = gains.setdefault(row["prefetch"], {})
        point = row["batch"], row["context"]
        at[point] = min(gain, at.get(point, gain))
    worst = {p: min(g.values()) for p, g in gains.items() if set(g) == points}
    best = max(worst, key=worst.get, default="none")
    return PrefetchConfig.from_label(best if worst.get(best, 0) > 1 else "none")
