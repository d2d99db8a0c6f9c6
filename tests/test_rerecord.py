"""benchmarks/rerecord.py: each committed GPU result's command, pointed into --out, run in turn
within a budget, on the CPU with a fake runner."""

import json
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rerecord  # noqa: E402


def test_every_h200_result_of_the_cli_is_a_part_with_its_command():
    parts = rerecord.parts("h200")
    files = {p.stem for p in (rerecord.RESULTS / "h200").glob("*.json")}
    # all of them came from `python -m kvlab bench`; the adopted parts come on top
    assert set(parts) == files | set(rerecord.ADOPT["h200"]) and list(parts) == sorted(parts)
    assert parts["attention_fp8"][:5] == ["python", "-m", "kvlab", "bench", "attention"]


def test_a_machine_adopts_another_machines_part_until_it_has_its_own(tmp_path, monkeypatch):
    """ADOPT: the H200 records the H100's step traces and lever runs with the H100's
    commands; once the H200 has a file of that name, its own command is the part's."""
    h200 = rerecord.parts("h200")
    for name, source in rerecord.ADOPT["h200"].items():
        own = rerecord.RESULTS / "h200" / f"{name}.json"
        recorded = json.loads((own if own.exists() else rerecord.RESULTS / source /
                               f"{name}.json").read_text())
        assert h200[name] == rerecord.amended(shlex.split(recorded["command"]),
                                              rerecord.AMEND["h200"].get(name, {})), name
    for machine in ("h100", "h200"):  # the lever grid's batches, at 4k and 32k
        parts = rerecord.parts(machine)
        for name in ("e2e_ahead_4k", "e2e_ahead_32k"):
            assert _values(parts[name], "--batches") == ["1", "16", "64", "128"], (machine, name)
    (tmp_path / "h100").mkdir()
    (tmp_path / "h200").mkdir()
    for machine, stem in (("h100", "steptrace"), ("h200", "steptrace"), ("h100", "e2e_ahead")):
        (tmp_path / machine / f"{stem}.json").write_text(json.dumps(
            {"command": f"python -m kvlab bench steptrace --models {machine}"}))
    monkeypatch.setattr(rerecord, "RESULTS", tmp_path)
    monkeypatch.setattr(rerecord, "ADOPT", {"h200": {"steptrace": "h100", "e2e_ahead": "h100"}})
    assert rerecord.parts("h200") == {
        "e2e_ahead": shlex.split("python -m kvlab bench steptrace --models h100"),
        "steptrace": shlex.split("python -m kvlab bench steptrace --models h200")}


def test_every_result_of_the_cli_names_its_own_file_as_its_output():
    """(never the path on the machine that recorded it)"""
    for path in sorted(rerecord.RESULTS.glob("*/*.json")):
        argv = shlex.split(json.loads(path.read_text()).get("command") or "")
        if argv[:4] == rerecord.PREFIX:
            assert _values(argv, "--json") == [str(path.relative_to(ROOT))], path


def _values(argv: list[str], option: str) -> list[str]:
    rest = argv[argv.index(option) + 1:]
    return rest[:next((i for i, t in enumerate(rest) if t.startswith("--")), len(rest))]


def test_the_h200_parts_gain_flashinfer_and_the_fair_hf_peer_once():
    parts = rerecord.parts("h200")
    for name in ("attention", "attention_fp8", "attention_bf16", "attention_small",
                 "attention_mixed", "attention_vllm"):
        assert _values(parts[name], "--kernels")[-2:] == ["flashinfer", "flashinfer_tc"], name
    assert "production:32768" in _values(parts["attention_mixed"], "--lengths")
    for name in ("e2e", "e2e_qwen7b", "e2e_qwen14b"):
        assert _values(parts[name], "--hf-compile") == ["both"]
        assert _values(parts[name], "--rounds") == ["2"] and parts[name].count("--rounds") == 1
    for name, argv in parts.items():  # amending what is amended changes nothing
        assert rerecord.amended(argv, rerecord.AMEND["h200"].get(name, {})) == argv


def test_every_hf_comparison_times_kvlab_on_hfs_basis_too():
    """gqa+sync beside gqa and HF: the H100's e2e_hf gains it once; the H200's HF files run the
    default variants, which hold it."""
    from kvlab.bench.e2e import VARIANTS

    argv = rerecord.parts("h100")["e2e_hf"]
    assert _values(argv, "--variants") == ["gqa", "gqa+sync"]
    assert rerecord.amended(argv, rerecord.AMEND["h100"]["e2e_hf"]) == argv
    for name in ("e2e", "e2e_qwen7b", "e2e_qwen14b"):
        assert "--variants" not in rerecord.parts("h200")[name] and "gqa+sync" in VARIANTS


def test_the_4k_step_counters_give_ncu_200_s_a_point_on_both_machines():
    for machine in ("h100", "h200"):
        argv = rerecord.parts(machine)["steptrace_4k_counters"]
        assert _values(argv, "--timeout") == ["200"] and argv.count("--timeout") == 1, machine


def test_amending_extends_lists_sets_values_and_adds_what_is_absent():
    argv = shlex.split("python -m kvlab bench attention --kernels gqa flashinfer --runs 5")
    assert rerecord.amended(argv, {"--kernels": ["flashinfer", "flashinfer_tc"],
                                   "--runs": ["21"], "--fp8": []}) == shlex.split(
        "python -m kvlab bench attention --kernels gqa flashinfer flashinfer_tc --runs 21 --fp8")


def test_a_parts_command_writes_into_out_and_never_resumes(tmp_path):
    recorded = shlex.split("python -m kvlab bench kvpr --json a.json --checkpoint b.json "
                           "--resume b.json --models llama2-7b --timeline-points --steps 5")
    argv = rerecord.command("kvpr_llama", recorded, tmp_path)
    assert argv[0] == sys.executable and argv[1:5] == ["-m", "kvlab", "bench", "kvpr"]
    assert "--resume" not in argv and "a.json" not in argv and "b.json" not in argv
    assert argv[5:9] == ["--models", "llama2-7b", "--timeline-points", "--steps"]
    assert argv[-4:] == ["--json", str(tmp_path / "kvpr_llama.json"), "--checkpoint",
                         str(tmp_path / "kvpr_llama_partial.json")]
    counters = rerecord.command("counters", shlex.split(
        "python -m kvlab bench counters --json=x.json"), tmp_path)
    assert counters[-2:] == ["--json", str(tmp_path / "counters.json")]  # no --checkpoint there


def test_the_benchmarks_with_a_checkpoint_are_those_whose_cli_takes_one():
    from kvlab.bench.cli import BENCHMARKS, parser

    takes = set()
    for name in BENCHMARKS:
        try:
            parser().parse_args(["bench", name, "--checkpoint", "x.json"])
            takes.add(name)
        except SystemExit:
            pass
    assert takes == set(rerecord.CHECKPOINTED)


def test_parts_run_in_turn_and_those_past_the_budget_wait(tmp_path):
    known = {"a": shlex.split("python -m kvlab bench cache"),
             "b": shlex.split("python -m kvlab bench cache"),
             "c": shlex.split("python -m kvlab bench cache")}
    ran = []

    def runner(argv, **kwargs):  # writes the result as the bench would, its command its argv
        ran.append(argv)
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps({"command": shlex.join(argv)}))
        return subprocess.CompletedProcess(argv, 0)

    log = rerecord.run(["a", "b", "c"], known, tmp_path, budget_s=100,
                       durations={"b": 500.0}, env={}, machine="h200", runner=runner)
    assert [p["name"] for p in log["parts"]] == ["a", "c"] and log["not_run"] == ["b"]
    assert all(p["returncode"] == 0 and p["wrote"] for p in log["parts"]) and len(ran) == 2
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["command"] == "python -m kvlab bench cache --json benchmarks/results/h200/c.json"


def test_a_part_that_wrote_its_result_then_aborted_records_the_canonical_command(tmp_path):
    """(bench steptrace writes its result, then aborts at exit); one stopped at the budget,
    whose file its runner left, keeps what it wrote."""
    known = {"a": shlex.split("python -m kvlab bench steptrace --models m")}

    def runner(argv, code, **kwargs):
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps({"command": shlex.join(argv)}))
        if code is None:
            raise subprocess.TimeoutExpired(argv, 1)
        return subprocess.CompletedProcess(argv, code)

    rerecord.run(["a"], known, tmp_path, None, {}, {}, "h100",
                 runner=lambda argv, **kw: runner(argv, -6, **kw))
    assert json.loads((tmp_path / "a.json").read_text())["command"] == (
        "python -m kvlab bench steptrace --models m --json benchmarks/results/h100/a.json")
    rerecord.run(["a"], known, tmp_path, None, {}, {}, "h100",
                 runner=lambda argv, **kw: runner(argv, None, **kw))
    assert str(tmp_path) in json.loads((tmp_path / "a.json").read_text())["command"]


def test_bad_names_and_machines_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rerecord.main(["--run", "attention", "nope", "--out", str(tmp_path)])
    assert "--run nope: no such part" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rerecord.main(["--machine", "tpu", "--list"])
    assert "--machine 'tpu': no results/tpu/" in capsys.readouterr().err


def test_list_prints_every_part(tmp_path, capsys):
    assert rerecord.main(["--machine", "h100", "--list", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in lines] == sorted(rerecord.parts("h100"))
    assert all(str(tmp_path) in line for line in lines)
    timed = rerecord.times("h100")
    assert timed and all(line.startswith(f"{name} ({rerecord.took(timed[name])}): ")
                         for line in lines if (name := line.split(" ")[0]) in timed)
    assert all(" (not timed yet): " in line for line in lines
               if line.split(" ")[0] not in timed)


def test_an_adopted_part_is_listed_and_budgeted_by_its_time_on_the_source(tmp_path, capsys,
                                                                         monkeypatch):
    elsewhere = rerecord.times("h100")
    adopted = [name for name, source in rerecord.ADOPT["h200"].items()
               if source == "h100" and name in elsewhere and name not in rerecord.times("h200")]
    assert adopted
    assert rerecord.main(["--machine", "h200", "--list", "--out", str(tmp_path)]) == 0
    lines = {line.split(" ")[0]: line for line in capsys.readouterr().out.splitlines()}
    for name in adopted:
        assert lines[name].startswith(
            f"{name} (not timed here; {rerecord.took(elsewhere[name])}): "), name
    seen = {}
    monkeypatch.setattr(rerecord, "gpu_here", lambda: "NVIDIA H200")
    monkeypatch.setattr(rerecord, "git_state", lambda: {
        "git_revision": "b" * 40, "git_dirty": False, "git_source": "checkout"})

    def fake_run(names, known, out, budget_s, durations, env, machine, after_part):
        seen["durations"] = durations
        return {"parts": [], "not_run": names}

    monkeypatch.setattr(rerecord, "run", fake_run)
    rerecord.main(["--machine", "h200", "--run", adopted[0], "--budget", "10", "--out",
                   str(tmp_path)])
    assert seen["durations"][adopted[0]] == elsewhere[adopted[0]]["seconds"]


def test_the_times_of_the_parts_that_ran_to_their_end_are_kept(tmp_path, capsys):
    """--add-times: the parts of a run's log (with where it ran) that ran to their end merged,
    not one that failed without its result; one that wrote its result, then exited non-zero,
    is; one stopped at the budget is kept as a lower bound (`at_least`) while it is longer than
    the time kept, and a run to its end replaces it; a later run replaces an earlier; a log
    without where it ran is refused, one whose parts all waited for budget merges nothing."""
    head = {"machine": "h100", "gpu": "G", "revision": "a" * 40, "dirty": False,
            "date": "2026-12-06"}
    logs = [tmp_path / "1.json", tmp_path / "2.json", tmp_path / "3.json", tmp_path / "bad.json"]
    logs[0].write_text(json.dumps({**head, "parts": [
        {"name": "a", "returncode": 0, "seconds": 10.0, "wrote": True},
        {"name": "b", "returncode": -6, "seconds": 20.0, "wrote": True},  # aborted at exit
        {"name": "c", "returncode": None, "seconds": 30.0, "wrote": False},  # at the budget
        {"name": "d", "returncode": 2, "seconds": 1.5, "wrote": False}]}))  # failed early
    logs[1].write_text(json.dumps({**head, "date": "2026-12-07", "dirty": True, "parts": [
        {"name": "a", "returncode": 0, "seconds": 12.0, "wrote": True},
        {"name": "b", "returncode": None, "seconds": 15.0, "wrote": False},  # shorter: kept 20
        {"name": "c", "returncode": 0, "seconds": 40.0, "wrote": True}]}))
    logs[2].write_text(json.dumps({**head, "parts": []}))
    logs[3].write_text(json.dumps({"parts": {}}))
    table = tmp_path / "times.json"
    lines = rerecord.add_times([json.loads(p.read_text()) for p in logs[:3]], table)
    assert lines == ["h100/a: 10 s on G at aaaaaaa, 2026-12-06",
                     "h100/b: 20 s on G at aaaaaaa, 2026-12-06",
                     "h100/c: at least 30 s on G at aaaaaaa, 2026-12-06",
                     "h100/a: 12 s on G at aaaaaaa + uncommitted changes, 2026-12-07",
                     "h100/c: 40 s on G at aaaaaaa + uncommitted changes, 2026-12-07"]
    assert rerecord.times("h100", table) == {
        "a": {"seconds": 12.0, "gpu": "G", "revision": "a" * 40, "dirty": True,
              "date": "2026-12-07"},
        "b": {"seconds": 20.0, "gpu": "G", "revision": "a" * 40, "dirty": False,
              "date": "2026-12-06"},
        "c": {"seconds": 40.0, "gpu": "G", "revision": "a" * 40, "dirty": True,
              "date": "2026-12-07"}}
    stopped = {**head, "parts": [{"name": "c", "returncode": None, "seconds": 50.0,
                                  "wrote": False}]}
    assert rerecord.add_times([stopped], table) == [
        "h100/c: at least 50 s on G at aaaaaaa, 2026-12-06"]
    assert rerecord.times("h100", table)["c"]["at_least"] is True
    failed = {**head, "machine": "h200", "parts": [{"name": "e", "returncode": 2,
                                                    "seconds": 1.0, "wrote": False}]}
    assert rerecord.add_times([failed], table) == []
    assert "h200" not in json.loads(table.read_text())  # no machine kept with nothing
    assert rerecord.times("h200", table) == {}
    with pytest.raises(SystemExit):
        rerecord.main(["--add-times", str(logs[3])])
    assert "--add-times: a log lacks machine, gpu, revision, date, parts" in (
        capsys.readouterr().err)


def test_a_part_run_as_shards_takes_their_sum_once_they_cover_it(tmp_path):
    """--add-times: h100's e2e_ahead_4k (four models) run as shards is kept as their sum, named,
    once shards that ran to their end on one revision cover its models once each (newest first:
    an older overlapping shard, one stopped at the budget or one of other code left out); it
    replaces the part's lower bound, not a run of the whole newer than the shards."""
    head = {"machine": "h100", "gpu": "G", "revision": "a" * 40, "dirty": False,
            "date": "2026-12-07"}
    shard = lambda models, seconds, returncode=0: {  # noqa: E731
        "name": f"e2e_ahead_4k@models={models}", "returncode": returncode, "seconds": seconds,
        "wrote": returncode is not None}
    table = tmp_path / "times.json"
    table.write_text(json.dumps({"h100": {
        "e2e_ahead_4k": {"seconds": 360.0, "gpu": "G", "revision": "b" * 40, "dirty": False,
                         "date": "2026-12-06", "at_least": True},
        "e2e_ahead_4k@models=llama3-8b,llama2-7b": {
            "seconds": 500.0, "gpu": "G", "revision": "b" * 40, "dirty": False,
            "date": "2026-12-06"}}}))
    first = {**head, "parts": [shard("llama3-8b", 115.0), shard("qwen2.5-7b", 207.0),
                               shard("llama3-8b,qwen2.5-7b", 183.0, None)]}
    assert rerecord.add_times([first], table)[-1].startswith("h100/e2e_ahead_4k@")
    assert rerecord.times("h100", table)["e2e_ahead_4k"]["at_least"] is True
    rest = {**head, "parts": [shard("llama2-7b", 56.0), shard("qwen2.5-14b", 74.0)]}
    assert rerecord.add_times([rest], table)[-1] == (
        "h100/e2e_ahead_4k: 452 s on G at aaaaaaa, 2026-12-07 (4 shards)")
    assert rerecord.times("h100", table)["e2e_ahead_4k"] == {
        "seconds": 452.0, "gpu": "G", "revision": "a" * 40, "dirty": False,
        "date": "2026-12-07", "shards": [f"e2e_ahead_4k@models={m}" for m in (
            "llama2-7b", "llama3-8b", "qwen2.5-14b", "qwen2.5-7b")]}
    assert rerecord.add_times([rest], table)[-1] == (  # the same sum again: nothing new
        "h100/e2e_ahead_4k@models=qwen2.5-14b: 74 s on G at aaaaaaa, 2026-12-07")
    whole = {**head, "date": "2026-12-08", "parts": [
        {"name": "e2e_ahead_4k", "returncode": 0, "seconds": 440.0, "wrote": True}]}
    rerecord.add_times([whole], table)
    rerecord.add_times([rest], table)
    assert rerecord.times("h100", table)["e2e_ahead_4k"]["seconds"] == 440.0


def test_the_committed_times_name_parts_of_their_machine():
    for machine in ("h100", "h200"):
        # (a shard's time is kept by its name: PART@OPTION=V,...)
        assert {name.partition("@")[0] for name in rerecord.times(machine)} <= set(
            rerecord.parts(machine))


def test_parts_run_only_on_the_gpu_their_results_were_recorded_on(tmp_path, monkeypatch,
                                                                  capsys):
    assert rerecord.recorded_gpus("h200") == {"NVIDIA H200"}
    monkeypatch.setattr(rerecord, "run", lambda *args: pytest.fail("ran on the wrong GPU"))
    for here in ("NVIDIA H100 80GB HBM3", None):
        monkeypatch.setattr(rerecord, "gpu_here", lambda here=here: here)
        with pytest.raises(SystemExit):
            rerecord.main(["--run", "attention", "--out", str(tmp_path)])
        assert (f"--machine h200: its results were recorded on NVIDIA H200; this machine's GPU "
                f"is {here or 'none'}: record them there") in capsys.readouterr().err


def test_a_run_writes_its_log_and_hands_the_gpu_checks_on(tmp_path, monkeypatch, capsys):
    """(Where no revision is known, the run says its times cannot be kept.)"""
    seen = {}
    monkeypatch.setattr(rerecord, "gpu_here", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(rerecord, "git_state", lambda: {
        "git_revision": None, "git_dirty": None, "git_source": None})

    def fake_run(names, known, out, budget_s, durations, env, machine, after_part):
        seen["env"] = env
        log = {"parts": [{"name": names[0], "command": "c", "returncode": 0, "seconds": 1.0}],
               "not_run": []}
        after_part(log)
        return log

    monkeypatch.setattr(rerecord, "run", fake_run)
    checks = tmp_path / "gpu_checks.json"
    checks.write_text('{"tests": "3 passed"}\n')
    assert rerecord.main(["--machine", "h100", "--run", "e2e_hf", "--out", str(tmp_path),
                          "--gpu-checks", str(checks)]) == 0
    assert seen["env"]["KVLAB_GPU_CHECKS"] == '{"tests": "3 passed"}'
    assert json.loads((tmp_path / "rerecord.json").read_text())["parts"][0]["name"] == "e2e_hf"
    assert "no revision known (no checkout, no KVLAB_GIT_REVISION): this run's times cannot " \
           "be kept" in capsys.readouterr().err


def test_after_every_part_the_log_is_written_and_out_packed(tmp_path, monkeypatch, capsys):
    """--pack: the log and the parts' files so far in one .tgz after each part, so that a call
    stopped at its limit still returns them; refused inside --out or in no folder."""
    out, pack = tmp_path / "rr", tmp_path / "rr.tgz"
    monkeypatch.setattr(rerecord, "gpu_here", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(rerecord, "git_state", lambda: {
        "git_revision": "b" * 40, "git_dirty": False, "git_source": "checkout"})
    packed = []

    def fake_run(names, known, out_, budget_s, durations, env, machine, after_part):
        for name in names:
            (out_ / f"{name}.json").write_text("{}")
            log = {"parts": [{"name": name, "command": "c", "returncode": 0, "seconds": 1.0}],
                   "not_run": []}
            after_part(log)
            with tarfile.open(pack) as tar:
                packed.append(sorted(tar.getnames()))
        return log

    monkeypatch.setattr(rerecord, "run", fake_run)
    assert rerecord.main(["--machine", "h100", "--run", "e2e_hf", "steptrace", "--out",
                          str(out), "--pack", str(pack)]) == 0
    assert packed == [["rr", "rr/e2e_hf.json", "rr/rerecord.json"],
                      ["rr", "rr/e2e_hf.json", "rr/rerecord.json", "rr/steptrace.json"]]
    assert not pack.with_name("rr.tgz.partial").exists()
    log = json.loads((out / "rerecord.json").read_text())
    assert (log["machine"], log["gpu"]) == ("h100", "NVIDIA H100 80GB HBM3")
    assert (log["revision"], log["dirty"]) == ("b" * 40, False) and log["date"]
    for bad in (out / "rr.tgz", tmp_path / "nowhere" / "rr.tgz", tmp_path):
        with pytest.raises(SystemExit):
            rerecord.main(["--machine", "h100", "--run", "e2e_hf", "--out", str(out),
                           "--pack", str(bad)])
        assert f"--pack {bad}: must be a file in a folder that exists, outside --out" in (
            capsys.readouterr().err)



def test_a_revision_that_cannot_be_read_is_refused_before_any_part(tmp_path, monkeypatch,
                                                                    capsys):
    def unreadable():
        raise ValueError("KVLAB_GIT_REVISION='abc', KVLAB_GIT_DIRTY='0': must be 40 hex digits")

    monkeypatch.setattr(rerecord, "gpu_here", lambda: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(rerecord, "git_state", unreadable)
    monkeypatch.setattr(rerecord, "run", lambda *args, **kwargs: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        rerecord.main(["--machine", "h100", "--run", "e2e_hf", "--out", str(tmp_path)])
    assert "error: KVLAB_GIT_REVISION='abc', KVLAB_GIT_DIRTY='0': must be 40 hex digits" in (
        capsys.readouterr().err)


def test_a_shard_runs_its_part_narrowed_to_some_of_its_values():
    known = rerecord.parts("h200")
    shards = rerecord.chosen(["e2e@models=llama2-7b", "e2e_qwen14b@batches=1,16"], known)
    assert _values(shards["e2e@models=llama2-7b"], "--models") == ["llama2-7b"]
    assert _values(shards["e2e@models=llama2-7b"], "--hf-compile") == ["both"]  # as amended
    assert _values(shards["e2e_qwen14b@batches=1,16"], "--batches") == ["1", "16"]  # a default
    small = rerecord.chosen(["attention_small@models=qwen2.5-7b"], known)
    assert _values(small["attention_small@models=qwen2.5-7b"], "--models") == ["qwen2.5-7b"]
    for bad, why in (("e2e@models=opt-13b", "e2e runs --models llama3-8b llama2-7b; a shard "
                      "takes some of them, each once"),
                     ("e2e@batches=1,1", "each once"),
                     ("e2e@contexts=1", "a shard is PART@OPTION=V,V... with OPTION one of "
                      "models, batches"),
                     ("e2e@models=", "a shard is PART@OPTION"),
                     ("attention_small@batches=1", "attention_small times --points"),
                     ("nope@models=x", "--run nope@models=x: no such part")):
        with pytest.raises(ValueError, match=re.escape(why)):
            rerecord.chosen([bad], known)


def _shard(out: Path, name: str, rows: list[dict], **run) -> None:
    (out / f"{name}.json").write_text(json.dumps({
        "benchmark": "e2e", "gpu": "NVIDIA H200", "git_revision": "c" * 40, "git_dirty": False,
        "components": {"engine": "1"}, "date": run.get("date", "2026-12-07"),
        "roofline_copy_gbps": run.get("roofline", 4000.0), "host": name, "rows": rows,
        "skipped": [], "tp": 1, "command": "as run"}))


@pytest.fixture
def nothing_held(monkeypatch):
    """No shards held in the committed results/ (whatever the tree holds)."""
    monkeypatch.setattr(rerecord, "held", lambda machine: {})


def test_merging_shards_gives_the_parts_rows_in_its_order_and_every_runs_provenance(
        tmp_path, nothing_held):
    """e2e_qwen14b split by batches, the shards given out of order and a checkpoint beside
    one: rows come back in the part's batch order, the first shard's run-level fields with
    every shard's under shards, the checkpoint ignored."""
    row = lambda batch, variant: {"model": "qwen2.5-14b", "batch": batch, "variant": variant}  # noqa: E731
    _shard(tmp_path, "e2e_qwen14b@batches=128,64", [row(128, "gqa"), row(64, "gqa")],
           roofline=4010.0, date="2026-12-08")
    _shard(tmp_path, "e2e_qwen14b@batches=16,1", [row(16, "gqa"), row(1, "gqa"), row(1, "hf")])
    _shard(tmp_path, f"e2e_qwen14b@batches=16,1{rerecord.CHECKPOINT}", [row(16, "gqa")])
    path = rerecord.merge("h200", "e2e_qwen14b", tmp_path)
    merged = json.loads(path.read_text())
    assert path == tmp_path / "e2e_qwen14b.json"
    assert [(r["batch"], r["variant"]) for r in merged["rows"]] == [
        (1, "gqa"), (1, "hf"), (16, "gqa"), (64, "gqa"), (128, "gqa")]
    assert merged["roofline_copy_gbps"] == 4000.0 and merged["date"] == "2026-12-07"
    assert [(s["name"], s["roofline_copy_gbps"], s["date"]) for s in merged["shards"]] == [
        ("e2e_qwen14b@batches=16,1", 4000.0, "2026-12-07"),
        ("e2e_qwen14b@batches=128,64", 4010.0, "2026-12-08")]
    assert merged["command"] == rerecord.canonical(
        "h200", "e2e_qwen14b", rerecord.parts("h200")["e2e_qwen14b"])


def test_shards_that_miss_a_value_or_differ_in_code_are_not_merged(tmp_path, capsys,
                                                                     nothing_held):
    _shard(tmp_path, "e2e@models=llama2-7b", [])
    with pytest.raises(ValueError, match="cover --models llama2-7b; the part's are llama3-8b "
                                         "llama2-7b, each once"):
        rerecord.merge("h200", "e2e", tmp_path)
    _shard(tmp_path, "e2e@models=llama3-8b", [])
    other = json.loads((tmp_path / "e2e@models=llama3-8b.json").read_text())
    for key, value in (("components", {"engine": "2"}), ("git_dirty", True),
                       ("gpu", "NVIDIA H100 80GB HBM3")):
        (tmp_path / "e2e@models=llama3-8b.json").write_text(json.dumps({**other, key: value}))
        with pytest.raises(ValueError, match=f"its shards differ in {key}"):
            rerecord.merge("h200", "e2e", tmp_path)
    _shard(tmp_path, "e2e@models=llama3-8b", [])
    _shard(tmp_path, "e2e@batches=1", [])
    with pytest.raises(ValueError, match="split it by batches, models; one option only"):
        rerecord.merge("h200", "e2e", tmp_path)
    with pytest.raises(SystemExit):
        rerecord.main(["--machine", "h200", "--merge", "e2e_2048", "--out", str(tmp_path)])
    assert "--merge e2e_2048: no shard e2e_2048@OPTION=V,... in" in capsys.readouterr().err


E2E4 = "python -m kvlab bench e2e --models llama3-8b qwen2.5-7b llama2-7b qwen2.5-14b"


def _held(tmp_path, monkeypatch, names: dict[str, str], current: bool = True) -> Path:
    """results/h200/ in tmp_path with the stale part `big` (E2E4) and `small` (one model),
    and, in shards/h200/ (HELD), a shard of each of `names` ({name: revision}), of the code as
    it stands (or not); TIMES empty and no part adopted. Returns shards/h200/."""
    from kvlab.components import versions

    _machine_with(tmp_path, monkeypatch, {
        "big": {"command": E2E4, "benchmark": "e2e", "components": {}, "gpu": "NVIDIA H200"},
        "small": {"command": "python -m kvlab bench e2e --models llama3-8b", "benchmark": "e2e",
                  "components": {}, "gpu": "NVIDIA H200"}}, {})
    monkeypatch.setattr(rerecord, "HELD", tmp_path / "shards")
    folder = tmp_path / "shards" / "h200"
    folder.mkdir(parents=True)
    for name, revision in names.items():
        model = name.partition("=")[2].split(",")
        _shard(folder, name, [{"model": m, "batch": 1, "variant": "gqa"} for m in model])
        result = json.loads((folder / f"{name}.json").read_text())
        result.update(git_revision=revision, components=versions() if current else {})
        (folder / f"{name}.json").write_text(json.dumps(result))
    return folder


def test_held_shards_of_other_commits_join_a_merge_and_leave_once_merged(tmp_path,
                                                                        monkeypatch):
    """Shards committed in benchmarks/shards/<machine>/ from calls at different revisions, of
    the code as it stands, merge with a shard just run; merged into results/<machine>/, they
    leave shards/, each with its revision kept under "shards"."""
    folder = _held(tmp_path, monkeypatch, {"big@models=llama3-8b,qwen2.5-7b": "a" * 40,
                                           "big@models=qwen2.5-14b": "b" * 40})
    (tmp_path / "run").mkdir()
    _shard(tmp_path / "run", "big@models=llama2-7b", [{"model": "llama2-7b", "batch": 1}])
    with pytest.raises(ValueError, match="its shards differ in components"):
        rerecord.merge("h200", "big", tmp_path / "run")  # the run's fixture code is not current
    fresh = json.loads((folder / "big@models=qwen2.5-14b.json").read_text())
    (tmp_path / "run" / "big@models=llama2-7b.json").write_text(json.dumps(
        {**fresh, "git_revision": "c" * 40, "rows": [{"model": "llama2-7b", "batch": 1}]}))
    shutil.copy(tmp_path / "run" / "big@models=llama2-7b.json", folder)
    path = rerecord.merge("h200", "big", tmp_path / "h200")
    merged = json.loads(path.read_text())
    assert path == tmp_path / "h200" / "big.json" and list(folder.iterdir()) == []
    assert [r["model"] for r in merged["rows"]] == ["llama3-8b", "qwen2.5-7b", "llama2-7b",
                                                    "qwen2.5-14b"]
    assert [(s["name"], s["git_revision"][0]) for s in merged["shards"]] == [
        ("big@models=llama3-8b,qwen2.5-7b", "a"), ("big@models=llama2-7b", "c"),
        ("big@models=qwen2.5-14b", "b")]


def test_shards_differing_only_in_code_their_benchmark_does_not_run_merge(tmp_path,
                                                                           monkeypatch):
    """A result records every component's version; shards join where those their benchmark
    measures agree (kvlab.components.BENCHMARKS), not where another changed between calls."""
    from kvlab.components import BENCHMARKS, COMPONENTS

    folder = _held(tmp_path, monkeypatch, {"big@models=llama3-8b,qwen2.5-7b": "a" * 40,
                                           "big@models=llama2-7b,qwen2.5-14b": "b" * 40})
    unrun = next(c for c in COMPONENTS if c not in BENCHMARKS["e2e"])
    path = folder / "big@models=llama2-7b,qwen2.5-14b.json"
    result = json.loads(path.read_text())
    path.write_text(json.dumps({**result, "components": {**result["components"],
                                                         unrun: "other"}}))
    assert rerecord.merge("h200", "big", tmp_path / "h200") == tmp_path / "h200" / "big.json"
    assert list(folder.iterdir()) == []


def test_the_plan_runs_only_what_held_shards_leave(tmp_path, monkeypatch, capsys):
    """A part with shards held is planned as a shard of the values they leave; one they cover
    is not planned but named for --merge; a held shard of older code does not count and is
    named for removal."""
    _held(tmp_path, monkeypatch, {"big@models=qwen2.5-7b": "a" * 40,
                                  "small@models=llama3-8b": "a" * 40})
    _shard(tmp_path / "shards" / "h200", "big@models=llama2-7b", [])  # old code
    (tmp_path / "times.json").write_text(json.dumps(
        {"h200": {"big": _timed(400.0), "small": _timed(50.0)}}))
    known = rerecord.parts("h200")
    assert rerecord.held_cover("h200", known) == {"big": ("models", ["qwen2.5-7b"]),
                                                  "small": ("models", ["llama3-8b"])}
    other = json.loads((tmp_path / "shards" / "h200" / "big@models=qwen2.5-7b.json").read_text())
    (tmp_path / "shards" / "h200" / "small@models=opt-13b.json").write_text(json.dumps(other))
    assert rerecord.held_cover("h200", known)["small"] == ("models", ["llama3-8b"])  # its own
    assert rerecord.plan("h200", known, ["big", "small"], 540.0) == (
        [[("big@models=llama3-8b,llama2-7b,qwen2.5-14b", 300.0, "here, shared")]], [])
    assert rerecord.plan("h200", known, ["big"], 200.0)[0] == [
        [("big@models=llama3-8b,llama2-7b", 200.0, "here, shared")],
        [("big@models=qwen2.5-14b", 100.0, "here, shared")]]
    assert rerecord.main(["--machine", "h200", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "big: shards held for --models qwen2.5-7b\n" in out
    assert ("small: shards held for --models llama3-8b; they cover it: python "
            "benchmarks/rerecord.py --machine h200 --merge small --out benchmarks/results/h200"
            in out)
    assert "benchmarks/shards/h200/big@models=llama2-7b.json: older than the code" in out


def _run_out(tmp_path: Path, files: dict[str, dict], log: dict | None = None) -> Path:
    """A device call's --out, unpacked: `files` ({name: changes to a current shard's result})
    and its rerecord.json (`log`)."""
    from kvlab.components import versions

    out = tmp_path / "rerecorded"
    out.mkdir(parents=True)
    for name, changes in files.items():
        models = name.removesuffix(rerecord.CHECKPOINT).partition("=")[2] or "llama3-8b"
        _shard(out, name, [{"model": model, "batch": 1} for model in models.split(",")])
        result = json.loads((out / f"{name}.json").read_text())
        (out / f"{name}.json").write_text(json.dumps(
            {**result, "components": versions(), **changes}))
    if log is not None:
        (out / "rerecord.json").write_text(json.dumps(log))
    return out


def test_taking_a_run_files_its_parts_and_shards_and_merges_what_they_cover(tmp_path,
                                                                          monkeypatch):
    """--take: a part's file into results/<machine>/, a shard's into shards/ (replacing
    a held shard it takes the values of again, and dropping one of older code), the run's
    times into TIMES, the checkpoint left; then the part the held shards cover merged."""
    folder = _held(tmp_path, monkeypatch, {"big@models=llama3-8b,qwen2.5-7b": "a" * 40,
                                           "big@models=llama2-7b": "a" * 40})
    _shard(folder, "small@models=llama3-8b", [])  # of older code
    log = {"machine": "h200", "gpu": "NVIDIA H200", "revision": "c" * 40, "dirty": False,
           "date": "2026-12-08", "parts": [
               {"name": "small", "returncode": 0, "seconds": 40.0, "wrote": True},
               {"name": "big@models=llama2-7b,qwen2.5-14b", "returncode": 0, "seconds": 90.0,
                "wrote": True}]}
    out = _run_out(tmp_path, {"small": {}, "big@models=llama2-7b,qwen2.5-14b": {},
                              f"big@models=qwen2.5-14b{rerecord.CHECKPOINT}": {},
                              "small@models=llama3-8b": {"components": {}}}, log)
    lines = rerecord.take("h200", out)
    assert f"{out}/small@models=llama3-8b.json: not kept, older than the code it measured" in (
        lines)
    assert (tmp_path / "h200" / "small.json").read_text() == (out / "small.json").read_text()
    assert list(folder.iterdir()) == [] and (tmp_path / "h200" / "big.json").is_file()
    assert [r["model"] for r in json.loads((tmp_path / "h200" / "big.json").read_text())[
        "rows"]] == ["llama3-8b", "qwen2.5-7b", "llama2-7b", "qwen2.5-14b"]
    assert rerecord.times("h200")["small"]["seconds"] == 40.0
    assert lines[-1] == "merged benchmarks/results/h200/big.json" and sum(
        line.startswith("removed benchmarks/shards/h200/") for line in lines) == 2


def test_a_shard_taken_again_replaces_its_older_self_and_siblings_of_other_software(
        tmp_path, monkeypatch):
    """A held shard of older code run again under its name is kept (not removed as old); a
    held sibling recorded under other package versions is replaced, not left to refuse the
    merge; what the run's shards then cover is merged."""
    folder = _held(tmp_path, monkeypatch, {"big@models=llama2-7b": "a" * 40}, current=False)
    older = json.loads((folder / "big@models=llama2-7b.json").read_text())
    from kvlab.components import versions

    (folder / "big@models=llama3-8b,qwen2.5-7b.json").write_text(json.dumps(
        {**older, "components": versions(), "versions": {"torch": "0.1"}}))
    out = _run_out(tmp_path, {"big@models=llama2-7b": {}})
    lines = rerecord.take("h200", out)
    assert sorted(p.name for p in folder.iterdir()) == ["big@models=llama2-7b.json"]
    assert lines[-1] == ("removed benchmarks/shards/h200/big@models=llama3-8b,qwen2.5-7b.json "
                         "(older code, or replaced by the run's)")
    out = _run_out(tmp_path / "again", {"big@models=llama3-8b,qwen2.5-7b,qwen2.5-14b": {}})
    assert rerecord.take("h200", out)[-1] == "merged benchmarks/results/h200/big.json"


def test_the_first_shard_taken_makes_the_machines_shards_folder(tmp_path, monkeypatch):
    folder = _held(tmp_path, monkeypatch, {})
    shutil.rmtree(tmp_path / "shards")
    out = _run_out(tmp_path, {"big@models=llama2-7b": {}})
    assert rerecord.take("h200", out) == [
        f"{out}/big@models=llama2-7b.json -> benchmarks/shards/h200/big@models=llama2-7b.json"]
    assert [p.name for p in folder.iterdir()] == ["big@models=llama2-7b.json"]


def test_a_run_is_not_taken_in_part(tmp_path, monkeypatch):
    """A file of another machine's GPU, of a tree with changes, of no part, or a log of another
    machine: refused by name, and nothing moved."""
    _held(tmp_path, monkeypatch, {})
    for files, log, why in (
            ({"small": {}, "big@models=llama2-7b": {"gpu": "NVIDIA H100 80GB HBM3"}}, None,
             "big@models=llama2-7b.json was recorded on NVIDIA H100 80GB HBM3; results/h200/ "
             "on NVIDIA H200"),
            ({"small": {"git_dirty": True}}, None, "small.json records git_dirty True"),
            ({"nope": {}}, None, "nope.json is no part of h200"),
            ({"big@models=opt-13b": {}}, None, "big runs --models llama3-8b"),
            ({"small": {}}, {"machine": "h100"}, "its rerecord.json is a run of h100, not h200")):
        out = _run_out(tmp_path, files, log)
        with pytest.raises(ValueError, match=re.escape(why)):
            rerecord.take("h200", out)
        assert sorted(p.name for p in (tmp_path / "h200").iterdir()) == [
            "big.json", "small.json"]
        assert not any((tmp_path / "shards" / "h200").iterdir())
        shutil.rmtree(out)


def test_the_committed_held_shards_can_join_their_parts():
    for folder in sorted(p for p in rerecord.HELD.glob("*") if p.is_dir()):
        assert rerecord.held_problems(folder.name) == []


def test_held_shards_that_could_not_join_their_part_are_named(tmp_path, monkeypatch):
    """held_problems: no shard of a part, another GPU or a dirty tree, two options, a value
    twice, shards of other code, and shards that cover their part whole."""
    folder = _held(tmp_path, monkeypatch, {"big@models=llama3-8b": "a" * 40,
                                           "big@batches=1": "a" * 40,
                                           "small@models=llama3-8b": "a" * 40})
    assert rerecord.held_problems("h200") == [
        "big: its shards split it by batches, models and take 1 llama3-8b; one option, each "
        "value once",
        "small: its shards cover it; merge them (--merge small)"]
    (folder / "big@batches=1.json").unlink()
    (folder / "small@models=llama3-8b.json").unlink()
    other = json.loads((folder / "big@models=llama3-8b.json").read_text())
    (folder / "big@models=qwen2.5-7b.json").write_text(json.dumps(
        {**other, "gpu": "NVIDIA H100 80GB HBM3", "versions": {"torch": "9"}}))
    (folder / "nope.json").write_text("{}")
    problems = rerecord.held_problems("h200")
    assert problems[0] == ("benchmarks/shards/h200/big@models=qwen2.5-7b.json: recorded on "
                           "NVIDIA H100 80GB HBM3 with git_dirty False; results/h200/ are of "
                           "NVIDIA H200, on committed trees")
    assert problems[1] == "benchmarks/shards/h200/nope.json: no shard of a part of h200"
    assert problems[2].startswith("big: its shards differ in benchmark, gpu")


def test_a_run_of_shards_hands_their_commands_on(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(rerecord, "gpu_here", lambda: "NVIDIA H200")
    monkeypatch.setattr(rerecord, "git_state", lambda: {
        "git_revision": "b" * 40, "git_dirty": False, "git_source": "checkout"})

    def fake_run(names, known, out, budget_s, durations, env, machine, after_part):
        seen.update(names=names, known=known)
        return {"parts": [], "not_run": []}

    monkeypatch.setattr(rerecord, "run", fake_run)
    rerecord.main(["--run", "e2e@models=llama3-8b", "e2e_2048", "--out", str(tmp_path)])
    assert seen["names"] == ["e2e@models=llama3-8b", "e2e_2048"]
    assert _values(seen["known"]["e2e@models=llama3-8b"], "--models") == ["llama3-8b"]
    assert seen["known"]["e2e_2048"] == rerecord.parts("h200")["e2e_2048"]


def _machine_with(tmp_path, monkeypatch, results: dict[str, dict], table: dict) -> None:
    """results/h200/<name>.json for each of `results` ({name: result}) and TIMES as `table`,
    in tmp_path, with no parts adopted."""
    (tmp_path / "h200").mkdir()
    for name, result in results.items():
        (tmp_path / "h200" / f"{name}.json").write_text(json.dumps(result))
    (tmp_path / "times.json").write_text(json.dumps(table))
    monkeypatch.setattr(rerecord, "RESULTS", tmp_path)
    monkeypatch.setattr(rerecord, "TIMES", tmp_path / "times.json")
    monkeypatch.setattr(rerecord, "ADOPT", {})


def _timed(seconds: float, **more) -> dict:
    return {"seconds": seconds, "gpu": "G", "revision": "a" * 40, "dirty": False,
            "date": "2026-12-07", **more}


def test_the_plan_takes_the_stale_parts_into_the_fewest_calls_by_their_times(
        tmp_path, monkeypatch, capsys):
    """--plan: the parts older than their code (or recording none) packed longest first into
    calls within the budget, each part timed here, else on another machine (a lower bound as
    such); one longer than the budget as shards by --models, its time shared; the parts timed
    nowhere named for the calls after; a current part left out."""
    from kvlab.components import versions

    e2e = "python -m kvlab bench e2e --models llama3-8b qwen2.5-7b llama2-7b qwen2.5-14b"
    stale = {"benchmark": "e2e", "components": {}}
    _machine_with(tmp_path, monkeypatch, {
        "big": {"command": e2e, **stale},
        "mid": {"command": "python -m kvlab bench e2e --models llama3-8b", **stale},
        "small": {"command": "python -m kvlab bench e2e --models llama3-8b"},  # none recorded
        "new": {"command": "python -m kvlab bench e2e --models llama3-8b", **stale},
        "current": {"command": "python -m kvlab bench e2e --models llama3-8b",
                    "benchmark": "e2e", "components": versions()}},
        {"h200": {"big": _timed(1000.0), "mid": _timed(300.0, at_least=True),
                  "current": _timed(5.0)},
         "h100": {"big": _timed(50.0), "small": _timed(200.0)}})
    known = rerecord.parts("h200")
    assert rerecord.to_rerecord("h200", known) == ["big", "mid", "new", "small"]
    calls, untimed = rerecord.plan("h200", known, ["big", "mid", "new", "small"], 540.0)
    assert calls == [
        [("big@models=llama3-8b,qwen2.5-7b", 500.0, "here, shared")],
        [("big@models=llama2-7b,qwen2.5-14b", 500.0, "here, shared")],
        [("mid", 300.0, "at least, here"), ("small", 200.0, "h100's")]]
    assert untimed == ["new"]
    calls = rerecord.plan("h200", known, ["big"], 400.0)[0]
    assert [shard[:2] for call in calls for shard in call] == [
        (f"big@models={model}", 250.0)
        for model in ("llama3-8b", "qwen2.5-7b", "llama2-7b", "qwen2.5-14b")]
    assert rerecord.main(["--machine", "h200", "--plan", "--budget", "540"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("h200: 4 of 5 parts to re-record") and "3 calls" in out[0]
    assert out[-4:-1] == ['call 3, ~500 s: RERECORD_H200="mid small"',
                         '  mid: 300 s (at least, here)', "  small: 200 s (h100's)"]
    assert out[-1].startswith('timed nowhere, for the calls after: RERECORD_H200="new" ')


def test_a_part_over_the_budget_that_cannot_be_split_is_planned_alone_and_said_so(
        tmp_path, monkeypatch, capsys):
    _machine_with(tmp_path, monkeypatch, {"long": {
        "command": "python -m kvlab bench e2e --models llama3-8b --batches 64"}},
        {"h200": {"long": _timed(900.0)}})
    assert rerecord.plan("h200", rerecord.parts("h200"), ["long"], 540.0) == (
        [[("long", 900.0, "here")]], [])
    assert rerecord.main(["--machine", "h200", "--plan"]) == 0
    assert "call 1, ~900 s (one part over the budget: shard it further)" in capsys.readouterr().out
    for budget in ("0", "-5", "nan"):
        with pytest.raises(SystemExit):
            rerecord.main(["--machine", "h200", "--plan", "--budget", budget])
        assert f"--budget {float(budget)}: a plan's calls need a budget above 0" in (
            capsys.readouterr().err)
