"""`python -m kvlab bench l2sim`: the L2 model's speed, reported against its target (CPU)."""

import json

from kvlab.bench.cli import main


def test_quick_run_reports_both_rates_against_the_target(tmp_path, capsys):
    path = tmp_path / "l2sim.json"
    assert main(["bench", "l2sim", "--quick", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    rates = result["cache_sectors_per_s"], result["simulate_sectors_per_s"]
    assert all(rate > 0 for rate in rates)
    assert isinstance(result["meets_target"], bool)  # its rule: tests/bench/test_targets.py
    for runs, rate in zip(("cache_runs", "simulate_runs"), rates, strict=True):
        assert len(result[runs]) == result["num_repeats"] and min(result[runs]) <= rate
    assert {"git_revision", "versions", "core"} <= set(result)
    assert "M sector accesses/s" in capsys.readouterr().out
