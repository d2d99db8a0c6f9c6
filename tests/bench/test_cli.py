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


def test_attention_variants_add_evict_last_twins_on_request():
    from kvlab.bench.attention import prefetch_variants

    plain = [p.label() for p in prefetch_variants(["none", "bulk"], [1, 2])]
    assert plain == ["none", "bulk K+V d=1", "bulk K+V d=2"]
    twins = [p.label() for p in prefetch_variants(["bulk"], [1], evict_last=True)]
    assert twins == ["none", "bulk K+V d=1", "bulk K+V d=1 evict_last"]
