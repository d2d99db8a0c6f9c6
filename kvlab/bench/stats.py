"""Win, tie or loss between two variants timed in the same loop, from their runs (`ms_runs`).

A ratio of medians says which variant was faster in one recording; whether that is more than the
run-to-run spread is what `versus` decides. The rule is kvlab.kernels.tune's (a prefetch setting
wins only where its upper quartile lies below no prefetch's lower quartile):

- "win": the variant's upper quartile is below the baseline's lower quartile (faster in at
  least three of four runs than the baseline in three of four);
- "loss": its lower quartile is above the baseline's upper quartile;
- "tie": the two interquartile ranges overlap (touching counts as overlap).

Quartiles as `statistics.quantiles(runs, n=4, method="inclusive")` (kvlab.timing.quartiles'),
so one run is its own quartiles. Pure Python: the docs' generator uses it without torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

OUTCOMES = ("win", "tie", "loss")


def quartiles(runs: Sequence[float]) -> tuple[float, float]:
    """(lower, upper) quartile of `runs` (ms, one or more finite numbers > 0). Raises ValueError
    for no runs or a run that is not a finite number > 0."""
    runs = [_check_run(i, t) for i, t in enumerate(runs)]
    if not runs:
        raise ValueError("runs=[]: needs at least one run")
    if len(runs) == 1:
        return runs[0], runs[0]
    q1, _, q3 = statistics.quantiles(runs, n=4, method="inclusive")
    return q1, q3


def versus(runs: Sequence[float], baseline_runs: Sequence[float]) -> str:
    """"win", "tie" or "loss" of a variant against a baseline timed in the same loop (each a
    row's `ms_runs`; lower is faster), by their interquartile ranges (the module's rule)."""
    lo, hi = quartiles(runs)
    base_lo, base_hi = quartiles(baseline_runs)
    if hi < base_lo:
        return "win"
    if lo > base_hi:
        return "loss"
    return "tie"


def speed_ratio(runs: Sequence[float], baseline_runs: Sequence[float]) -> float:
    """The variant's speed over the baseline's: the baseline's median ms over the variant's."""
    quartiles(runs), quartiles(baseline_runs)  # the same checks
    return statistics.median(baseline_runs) / statistics.median(runs)


def tally(pairs) -> dict[str, int]:
    """{"win": n, "tie": n, "loss": n} over (runs, baseline_runs) pairs, e.g. one per point:
    "at least the baseline's speed at win + tie points, tie of them ties"."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for runs, baseline_runs in pairs:
        counts[versus(runs, baseline_runs)] += 1
    return counts


def _check_run(i: int, t) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf"):
        raise ValueError(f"runs[{i}]={t!r}: must be a finite number of ms > 0")
    return float(t)
