"""`python -m kvlab bench ...`: the report and JSON of a run, and every bad value refused in one
line with exit status 2 before any benchmark work (CPU)."""

import json
import re
import shlex
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
    assert isinstance(result["meets_target"], bool)  # its rule: tests/bench/test_targets.py
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
        (["bench", "e2e", "--ahead-bytes", "-1"],
         "argument --ahead-bytes: '-1': must be an integer in [0, 1073741824]"),
        (["bench", "e2e", "--ahead-bytes", "8MB"], "'8MB': must be an integer in [0, "),
        (["bench", "e2e", "--serve-variant", "gqa+ahead"],
         "argument --serve-variant: invalid choice: 'gqa+ahead'"),
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


def test_a_json_link_into_a_missing_folder_is_refused_before_the_benchmark_runs(tmp_path):
    """It passed the check, the benchmark ran, and its result was lost to FileNotFoundError. A
    link to a file not yet written, in a folder that exists, is fine."""
    link = tmp_path / "result.json"
    link.symlink_to(tmp_path / "gone" / "result.json")
    with pytest.raises(ValueError, match=re.escape(f"--json {link}: the folder {tmp_path}/gone "
                                                   "does not exist")):
        cli.check_writable("--json", str(link))
    (tmp_path / "gone").mkdir()
    cli.check_writable("--json", str(link))


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


# -- every path option checked before any work ------------------------------------------------

def refused(argv, capsys) -> str:
    """The one line `cli.parse(argv)` ends with (exit status 2)."""
    with pytest.raises(SystemExit) as exit_:
        cli.parse(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    return err


OUTPUTS = [(name, "--json") for name in cli.BENCHMARKS] + [
    (name, "--checkpoint") for name in ("attention", "kvpr", "timeline", "e2e")]


@pytest.mark.parametrize(("name", "option"), OUTPUTS)
def test_every_output_path_is_checked_before_the_run(name, option, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    bad = {"": "must be a file path",
           str(tmp_path): "is a folder, must be a file path",
           f"{tmp_path}/newdir/": "ends in a separator, must be a file path",
           f"{tmp_path}/": "is a folder, must be a file path",
           f"{tmp_path}/no/such/x.json": "the folder",
           f"{tmp_path}/a_file/x.json": f"the folder {tmp_path}/a_file is not a folder",
           f"{tmp_path}/{'x' * 256}.json": "the file name is longer than 255 bytes",
           f"{tmp_path}/nul\0.json": "must be a file path"}
    for path, message in bad.items():
        err = refused(["bench", name, option, path], capsys)
        assert f"python -m kvlab bench {name}: error: {option} " in err and message in err, err
    args = cli.parse(["bench", name, option, str(tmp_path / "ok.json")])
    assert getattr(args, option[2:]) == str(tmp_path / "ok.json")
    assert not (tmp_path / "ok.json").exists()  # checked, not written


def test_an_output_where_nothing_can_be_written_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)
    err = refused(["bench", "cache", "--json", str(tmp_path / "x.json")], capsys)
    assert f"--json {tmp_path / 'x.json'}: not writable" in err


@pytest.mark.parametrize(("name", "option"), [("kvpr", "--resume"), ("attention", "--vllm-cubin")])
def test_input_paths_must_be_files(name, option, tmp_path, capsys):
    for path in ("", str(tmp_path), str(tmp_path / "missing.json")):
        assert f"{option} {shlex.quote(path)}: no such file" in refused(
            ["bench", name, option, path], capsys)


@pytest.mark.parametrize("path", ["", "newdir/"])
def test_a_json_path_that_cannot_take_the_result_fails_before_the_benchmark(path, tmp_path):
    out = subprocess.run([sys.executable, "-m", "kvlab", "bench", "cache", "--quick", "--json",
                          path], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 2 and out.stdout == "", out.stderr  # nothing ran
    assert out.stderr.count("\n") == 1
    assert "python -m kvlab bench cache: error: --json" in out.stderr
    assert list(tmp_path.iterdir()) == []


# -- numbers -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["attention", "--runs", "-3"], "argument --runs: '-3': must be an integer >= 1"),
    (["attention", "--runs", "2147483648"], "'2147483648': must be an integer in [1, 2147483647]"),
    (["attention", "--batches", "9" * 23], "must be an integer in [1, 2147483647]"),
    (["attention", "--points", "1x99999999999999"], "must be BATCHxCONTEXT"),
    (["attention", "--runs", "2.5"], "'2.5': must be an integer >= 1"),
    (["attention", "--lengths", "lognormal:10,99999999999"], "MAX <= 2147483647"),
    (["attention", "--lengths", "lognormal:²,16"], "must be lognormal:MEAN,MAX"),
    (["timeline", "--traces", "0"], "argument --traces: '0': must be an integer >= 1"),
    (["kvpr", "--min-seconds", "inf"], "'inf': must be a finite number >= 0"),
    (["kvpr", "--min-seconds", "-1"], "'-1': must be a finite number >= 0"),
    (["kvpr", "--host-budget-gib", "nan"], "'nan': must be a finite number >= 0"),
    (["kvpr", "--hf-max-tokens", "1e3"], "'1e3': must be an integer >= 1"),
    (["counters", "--timeout", "1e9"], "argument --timeout: '1e9': must be a number in (0, 3600]"),
    (["counters", "--timeout", "0"], "'0': must be a number > 0"),
    (["counters", "--block-size", "0"], "'0': must be an integer >= 1"),
    (["e2e", "--serve-rates", "nan"], "'nan': must be a finite number >= 0"),
    (["e2e", "--serve-requests", "-5"], "'-5': must be an integer >= 1"),
    (["e2e", "--tp", "4294967296"], "must be an integer in [1, 2147483647]"),
])
def test_hostile_numbers_end_in_one_line(argv, message, capsys):
    err = refused(["bench", *argv], capsys)
    assert message in err, err


def test_a_result_json_cannot_hold_leaves_the_checkpoint_before_it(tmp_path):
    from kvlab.bench.env import write_checkpoint

    path = tmp_path / "checkpoint.json"
    write_checkpoint(str(path), {"rows": [1]})
    for bad in ({"rows": [1, object()]}, {"rows": [1], "x": {(1, 2): 3}}):
        with pytest.raises(TypeError):
            write_checkpoint(str(path), bad)
        assert json.loads(path.read_text()) == {"rows": [1]}
