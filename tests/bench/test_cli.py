import json
import subprocess
import sys


def test_bench_cache_prints_and_writes_json(tmp_path):
    path = tmp_path / "cache.json"
    out = subprocess.run(
        [sys.executable, "-m", "kvlab", "bench", "cache", "--quick", "--json", str(path)],
        capture_output=True, text=True, check=True,
    )
    assert "allocate(1) + free" in out.stdout and "pairs/s" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "cache"
    assert result["pool_pairs_per_s"] > 0 and result["num_repeats"] == 3
    assert result["command"] == f"python -m kvlab bench cache --quick --json {path}"
    assert result["meets_target"] == (result["pool_pairs_per_s"] >= 500_000)


def test_unknown_benchmark_is_refused():
    out = subprocess.run([sys.executable, "-m", "kvlab", "bench", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "invalid choice: 'nope'" in out.stderr
