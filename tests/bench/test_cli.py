"""`python -m kvlab bench ...`: the report and JSON of a run, and every bad value refused in one
line with exit status 2 before any benchmark work (CPU)."""

import json
import subprocess
import sys

import pytest

from kvlab.bench import cli


def kvlab(*argv):
    return subprocess.run([sys.executable, "-m", "kvlab", *argv], capture_output=True, text=True)


def test_bench_cache_prints_and_writes_json(tmp_path):
    path = tmp_path / "cache.json"
    out = kvlab("bench", "cache", "--quick", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "allocate(1) + free" in out.stdout and "pairs/s" in out.stdout
    result = json.loads(path.read_text())
    assert result["benchmark"] == "cache"
    assert result["pool_pairs_per_s"] > 0 and result["num_repeats"] == 3
    assert result["command"] == f"python -m kvlab bench cache --quick --json {path}"
    assert result["meets_target"] == (result["pool_pairs_per_s"] >= 500_000)
    assert {"git_revision", "git_dirty", "versions"} <= set(result)


@pytest.mark.parametrize("name", ["attention", "kvpr"])
def test_help_lists_the_benchmarks_own_options(name):
    out = kvlab("bench", name, "--help")
    assert out.returncode == 0
    own = {"attention": ["--block-sizes", "--prefetch", "--distances", "--kernels", "--runs",
                         "--sms", "--in-order"],
           "kvpr": ["--schedules", "--gpu-batches", "--hf", "--resume", "--host-budget-gib"]}
    for option in [*own[name], "--models", "--batches", "--json"]:
        assert option in out.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "nope"], "invalid choice: 'nope'"),
        (["bench", "kvpr", "--batches", "-1"], "argument --batches: '-1': must be an integer >= 1"),
        (["bench", "kvpr", "--steps", "0"], "argument --steps: '0': must be an integer >= 1"),
        (["bench", "kvpr", "--chunks", "-1"], "argument --chunks: '-1': must be an integer >= 1"),
        (["bench", "kvpr", "--min-seconds", "nan"], "'nan': must be a finite number >= 0"),
        (["bench", "kvpr", "--host-budget-gib", "0"], "'0': must be a number > 0"),
        (["bench", "kvpr", "--timeline-points", "16by1024"], "must be BATCHxCONTEXT"),
        (["bench", "kvpr", "--models", "gpt-5"], "argument --models: invalid choice: 'gpt-5'"),
        (["bench", "attention", "--runs", "0"], "argument --runs: '0': must be an integer >= 1"),
        (["bench", "attention", "--block-sizes", "48"], "'48': must be a power of two in [1, 256]"),
        (["bench", "attention", "--distances", "17"], "'17': must be an integer in [1, 16]"),
        (["bench", "attention", "--sms", "0"], "argument --sms: '0': must be an integer >= 1"),
        (["bench", "attention", "--lengths", "lognormal:4000,2000"],
         "'lognormal:4000,2000': must be lognormal:MEAN,MAX with integers 1 <= MEAN <= MAX"),
        (["bench", "attention", "--lengths", "uniform:1,2"], "must be lognormal:MEAN,MAX"),
        (["bench", "attention", "--points", "2x64", "--lengths", "lognormal:10,20"],
         "--points and --lengths: give one"),
        (["bench", "attention", "--points", "2by64"], "must be BATCHxCONTEXT"),
        (["bench", "cache", "--json", "/no/such/folder/cache.json"],
         "--json /no/such/folder/cache.json: the folder /no/such/folder does not exist"),
        (["bench", "e2e", "--checkpoint", "/no/such/folder/e2e.json"],
         "--checkpoint /no/such/folder/e2e.json: the folder /no/such/folder does not exist"),
    ],
)
def test_bad_values_end_in_one_line_and_exit_status_2(argv, message):
    out = kvlab(*argv)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr


def test_an_unwritable_json_path_is_refused_before_the_benchmark_runs(tmp_path):
    (tmp_path / "folder.json").mkdir()
    out = kvlab("bench", "cache", "--quick", "--json", str(tmp_path / "folder.json"))
    assert out.returncode == 2 and "is a folder, must be a file path" in out.stderr
    assert "pairs/s" not in out.stdout  # nothing ran


def test_gpu_benchmarks_without_a_gpu_say_so_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    for name in ("attention", "kvpr"):
        if name == "kvpr":
            import torch

            monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        with pytest.raises(SystemExit) as exit_:
            cli.main(["bench", name])
        assert exit_.value.code == 2
        assert f"python -m kvlab bench {name}: error: python -m kvlab bench {name} needs a CUDA " \
               "GPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"), [("16x1024", (16, 1024)), ("8X512", (8, 512))]
)
def test_points_parse(text, expected):
    assert cli.batch_x_context(text) == expected


def test_attention_variants_add_evict_last_twins_on_request():
    from kvlab.bench.attention import prefetch_variants

    plain = [p.label() for p in prefetch_variants(["none", "bulk"], [1, 2])]
    assert plain == ["none", "bulk K+V d=1", "bulk K+V d=2"]
    twins = [p.label() for p in prefetch_variants(["bulk"], [1], evict_last=True)]
    assert twins == ["none", "bulk K+V d=1", "bulk K+V d=1 evict_last"]


def test_a_checkpoint_is_the_result_as_it_stands(tmp_path):
    from kvlab.bench.env import write_checkpoint

    path = tmp_path / "checkpoint.json"
    write_checkpoint(None, {"rows": [1]})  # no --checkpoint: nothing written
    assert not path.exists()
    write_checkpoint(str(path), {"rows": [1]})
    write_checkpoint(str(path), {"rows": [1, 2]})
    assert json.loads(path.read_text()) == {"rows": [1, 2]}
