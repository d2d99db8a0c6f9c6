"""Win, tie or loss against the run-to-run spread (kvlab.bench.stats), on synthetic runs."""

import random

import pytest

from kvlab.bench.stats import quartiles, speed_ratio, tally, versus


def noisy(median: float, spread: float, n: int = 25, seed: int = 0) -> list[float]:
    """n runs around `median`, uniform within +-spread (relative)."""
    rng = random.Random(seed)
    return [median * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_gap_wider_than_both_spreads_is_a_win_or_a_loss():
    fast, slow = noisy(10.0, 0.01), noisy(11.0, 0.01, seed=1)  # 10% apart, +-1% spread
    assert versus(fast, slow) == "win"
    assert versus(slow, fast) == "loss"


def test_a_gap_inside_the_spread_is_a_tie_even_when_the_medians_differ():
    a, b = noisy(10.0, 0.05), noisy(10.1, 0.05, seed=1)  # 1% apart, +-5% spread
    assert speed_ratio(a, b) != 1.0  # the medians alone would call a winner
    assert versus(a, b) == versus(b, a) == "tie"


def test_the_same_gap_is_a_win_with_tight_runs_and_a_tie_with_loose_ones():
    assert versus(noisy(10.0, 0.005), noisy(10.3, 0.005, seed=1)) == "win"
    assert versus(noisy(10.0, 0.05), noisy(10.3, 0.05, seed=1)) == "tie"


def test_one_outlier_run_does_not_turn_a_win_into_a_tie():
    fast = [10.0] * 24 + [50.0]  # one run hit by something else on the GPU
    slow = [11.0] * 25
    assert versus(fast, slow) == "win"


def test_quartiles_are_inclusive_and_one_run_is_its_own():
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert quartiles([3.0]) == (3.0, 3.0)
    assert versus([3.0], [3.0]) == "tie"  # touching ranges overlap


def test_speed_ratio_is_the_baselines_median_over_the_variants():
    assert speed_ratio([2.0, 2.0, 9.0], [3.0, 3.0, 3.0]) == pytest.approx(1.5)


def test_tally_counts_each_outcome():
    pairs = [(noisy(10, 0.01), noisy(12, 0.01, seed=1)),  # win
             (noisy(10, 0.05), noisy(10, 0.05, seed=1)),  # tie
             (noisy(12, 0.01), noisy(10, 0.01, seed=1))]  # loss
    assert tally(pairs) == {"win": 1, "tie": 1, "loss": 1}
    assert tally([]) == {"win": 0, "tie": 0, "loss": 0}


@pytest.mark.parametrize(("runs", "message"), [
    ([], "runs=[]: needs at least one run"),
    ([1.0, 0.0], "runs[1]=0.0: must be a finite number of ms > 0"),
    ([float("nan")], "runs[0]=nan"),
    ([True], "runs[0]=True"),
])
def test_bad_runs_are_refused_naming_the_run(runs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        versus(runs, [1.0])


def test_the_recorded_sdpa_rows_give_a_tally_over_the_grid():
    """On the recorded H200 grid: every point with gqa (no prefetch) and SDPA in one loop has
    the runs to decide it (63 points)."""
    from kvlab.results import load_result

    rows = load_result("h200", "attention")["rows"]
    by_loop = {}
    for r in rows:
        by_loop.setdefault(r["loop"], {})[r["kernel"], r["prefetch"]] = r
    pairs = [(loop["gqa", "none"]["ms_runs"], loop["sdpa", "none"]["ms_runs"])
             for loop in by_loop.values() if ("gqa", "none") in loop and ("sdpa", "none") in loop]
    counts = tally(pairs)
    assert sum(counts.values()) == len(pairs) == 63
