"""`python -m kvlab bench kvpr`: the split of each setting, bad settings, the bookkeeping of a
grid and of a resumed run (CPU, with the GPU's part replaced), and a tiny run of the whole
harness (GPU)."""

import json
import re
import statistics

import pytest
import torch

from kvlab.bench import env, kvpr
from kvlab.bench.cli import main
from kvlab.bench.kvpr import HF_SETTING, SETTINGS, host_bytes, measure_point, split_for
from kvlab.bench.steps import MAX_WARMUP_STEPS
from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.host import store_bytes
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split
from kvlab.offload.weights import Packing

HW = LinkAndCompute(55.4e9, 670e12, "what-if")


def test_each_setting_runs_its_split():
    shape = LayerShape(MODELS["opt-6.7b"], 16, 1024)
    assert split_for("full-transfer", shape, HW, 4) == 0
    assert split_for("full-recompute", shape, HW, 4) == 1024
    for model in ("paper", "chunked", "pipelined"):
        assert split_for(f"kvpr-{model}", shape, HW, 4) == best_split(shape, HW, model, 4).l


def test_host_bytes_count_stores_offloaded_weights_and_hf_cache():
    m = MODELS["llama2-7b"]
    stores = store_bytes(m, 16, 1026)
    assert host_bytes("llama2-7b", 16, 1024) == stores["total"]
    shapes = random_layers(m, num_layers=1, dtype=torch.float16, device="meta")[0]
    layer = Packing.of(shapes).num_bytes
    assert host_bytes("llama2-7b", 16, 1024, "offloaded") == stores["total"] + 32 * layer
    assert host_bytes("llama2-7b", 16, 1024, hf=True) == stores["total"] + stores["kv"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"gpu_batches": 3}, "gpu_batches=3: must divide batch=16"),
        ({"gpu_batches": 0}, "gpu_batches=0: must be an integer >= 1"),
        ({"steps": 0}, "steps=0: must be an integer >= 1"),
        ({"chunks": 0}, "chunks=0: must be an integer >= 1"),
        ({"min_seconds": -1}, "min_seconds=-1: must be a finite number >= 0"),
        ({"min_seconds": float("inf")}, "min_seconds=inf: must be a finite number >= 0"),
        ({"schedule": "diagonal"}, "schedule='diagonal': must be one of"),
        ({"weights": "disk"}, "weights='disk': must be one of"),
        ({"hf": True, "weights": "offloaded"}, "hf=True with schedule='row', gpu_batches=1, "
                                               "weights='offloaded'"),
        ({"overlap_setting": "fast"}, "overlap_setting='fast': must be one of"),
        ({"name": "gpt-5"}, "name='gpt-5': must be one of"),
        ({"context": 0}, "context=0: must be an integer >= 1"),
    ],
)
def test_measure_point_refuses_bad_settings_before_anything_else(change, message):
    kwargs = {"name": "opt-6.7b", "batch": 16, "context": 1024, **change}
    with pytest.raises(ValueError, match=re.escape(message)):
        measure_point(**kwargs)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--weights", "offloaded", "--hf"], "--hf: HF's cache is compared with the row schedule"),
        (["--gpu-batches", "0"], "argument --gpu-batches: '0': must be an integer >= 1"),
        (["--steps", "0"], "argument --steps: '0': must be an integer >= 1"),
    ],
)
def test_bad_command_lines_are_refused_before_any_gpu_work(options, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "kvpr", "--models", "tiny-opt", *options])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def fake_gpu(monkeypatch):
    """kvpr.run on the CPU: a GPU named "Fake GPU" and a measure_point that records its calls and
    returns one row per setting (and HF's when asked)."""
    calls = []

    def measure_point(name, batch, context, *, schedule, gpu_batches, weights, hf, **_):
        calls.append((name, batch, context, schedule, gpu_batches, weights, hf))
        point = {"model": name, "batch": batch, "context": context, "schedule": schedule,
                 "gpu_batches": gpu_batches, "weights": weights}
        settings = [*SETTINGS, HF_SETTING] if hf else SETTINGS
        return {"rows": [{**point, "setting": s, "l": 0, "step_ms": 1.0, "tokens_per_s": 1.0,
                          "ratio_to_lower_bound": 1.0, "overlap": 1.0} for s in settings],
                "overlap": None}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(kvpr, "gpu_info", lambda: {"gpu": "Fake GPU"})
    monkeypatch.setattr(kvpr, "gpu_state", lambda: {})
    code = {"git_revision": "a" * 40, "git_dirty": False, "git_source": "checkout"}
    monkeypatch.setattr(env, "git_state", lambda: code)  # what run_info records
    monkeypatch.setattr(kvpr, "git_state", lambda: code)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(kvpr, "random_layers", lambda *args, **kwargs: None)
    monkeypatch.setattr(kvpr, "measure_point", measure_point)
    return calls


# llama2-7b at batch 8: host GiB of the stores (with HF's copy of the KV): 3 (5) at context 512,
# 6 (10) at 1024, 12 (20) at 2048
GRID = ["--models", "llama2-7b", "--batches", "8", "--schedules", "row", "--gpu-batches", "1",
        "--steps", "3", "--hf", "--timeline-points"]


def skip(context, setting, reason):
    point = dict(zip(kvpr.POINT, ("llama2-7b", 8, context, "row", 1, "resident"), strict=True))
    return {**point, "reason": reason} if setting is None else {
        **point, "setting": setting, "reason": reason}


def test_grid_skips_what_the_host_budget_cannot_hold_and_hf_alone_where_only_it_cannot(
        fake_gpu, tmp_path, capsys):
    out = tmp_path / "kvpr.json"
    main(["bench", "kvpr", "--json", str(out), *GRID, "--host-budget-gib", "7",
          "--contexts", "512", "1024", "2048"])
    result = json.loads(out.read_text())
    assert fake_gpu == [("llama2-7b", 8, 512, "row", 1, "resident", True),
                        ("llama2-7b", 8, 1024, "row", 1, "resident", False)]
    assert len(result["rows"]) == 2 * len(SETTINGS) + 1
    assert result["skipped"] == [skip(1024, HF_SETTING, "host memory of 10 GiB > 7 GiB"),
                                 skip(2048, None, "host memory of 12 GiB > 7 GiB")]
    assert "skipped llama2-7b B=8 ctx=1024 row/1 resident hf-offloaded: host memory" in (
        capsys.readouterr().out)


def test_points_replace_the_product_of_batches_and_contexts(fake_gpu, tmp_path):
    main(["bench", "kvpr", "--json", str(tmp_path / "kvpr.json"), *GRID, "--batches", "8", "16",
          "--contexts", "512", "1024", "--points", "8x1024", "16x512"])
    assert [call[1:3] for call in fake_gpu] == [(8, 1024), (16, 512)]


def test_resumed_run_keeps_the_rows_and_measures_only_the_missing_points(fake_gpu, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    main(["bench", "kvpr", "--checkpoint", str(first), *GRID, "--host-budget-gib", "7",
          "--contexts", "512", "1024", "2048"])
    checkpoint = json.loads(first.read_text())
    assert checkpoint["command"].startswith("python -m kvlab bench kvpr --checkpoint")
    fake_gpu.clear()
    main(["bench", "kvpr", "--json", str(second), "--resume", str(first), *GRID,
          "--host-budget-gib", "15", "--contexts", "1024", "2048"])
    result = json.loads(second.read_text())
    assert fake_gpu == [("llama2-7b", 8, 2048, "row", 1, "resident", False)]  # 1024 was measured
    assert result["rows"][:len(checkpoint["rows"])] == checkpoint["rows"]
    assert len(result["rows"]) == 3 * len(SETTINGS) + 1
    # 1024's entry is kept; 2048's is decided anew
    assert result["skipped"] == [skip(1024, HF_SETTING, "host memory of 10 GiB > 7 GiB"),
                                 skip(2048, HF_SETTING, "host memory of 20 GiB > 15 GiB")]
    assert result["resumed_from"] == [{"date": checkpoint["date"], "git_revision": "a" * 40,
                                       "command": checkpoint["command"], "points": 2}]


@pytest.mark.parametrize(
    ("edit", "options", "message"),
    [
        ({"benchmark": "attention"}, [], "not a result of python -m kvlab bench kvpr"),
        ({}, ["--steps", "5"], "it was timed with steps=3, this run with steps=5"),
        ({}, ["--no-cuda-graphs"], "it was timed with cuda_graphs=True, this run with "
                                   "cuda_graphs=False"),
        ({"gpu": "NVIDIA H20"}, [], "measured on NVIDIA H20, this GPU is Fake GPU"),
        ({"rows": None, "skipped": None}, [], "it lacks rows, skipped"),
        ({"git_revision": "b" * 40}, [], f"it was made by revision {'b' * 40} (dirty: False), "
                                         f"this run is revision {'a' * 40} (dirty: False); a "
                                         "resumed run must run the same committed code"),
        ({"git_dirty": True}, [], "(dirty: True)"),
        ({"git_revision": None}, [], "it was made by revision None"),
    ],
)
def test_resume_refuses_a_result_timed_another_way_or_by_other_code(fake_gpu, tmp_path, edit,
                                                                     options, message, capsys):
    path = tmp_path / "kvpr.json"
    main(["bench", "kvpr", "--json", str(path), *GRID, "--contexts", "512"])
    edited = {**json.loads(path.read_text()), **edit}  # None: the key removed
    path.write_text(json.dumps({key: value for key, value in edited.items() if value is not None}))
    fake_gpu.clear()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "kvpr", "--resume", str(path), *GRID, "--contexts", "1024", *options])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert fake_gpu == []


def test_a_dirty_tree_cannot_resume(fake_gpu, tmp_path, monkeypatch, capsys):
    path = tmp_path / "kvpr.json"
    main(["bench", "kvpr", "--json", str(path), *GRID, "--contexts", "512"])
    dirty = {"git_revision": "a" * 40, "git_dirty": True, "git_source": "checkout"}
    monkeypatch.setattr(kvpr, "git_state", lambda: dirty)
    with pytest.raises(SystemExit):
        main(["bench", "kvpr", "--resume", str(path), *GRID, "--contexts", "1024"])
    assert "this run is revision " + "a" * 40 + " (dirty: True)" in capsys.readouterr().err


def test_resume_refuses_a_file_that_is_not_json(fake_gpu, tmp_path, capsys):
    path = tmp_path / "kvpr.json"
    path.write_text("{ cut short")
    with pytest.raises(SystemExit):
        main(["bench", "kvpr", "--resume", str(path), *GRID])
    assert f"--resume {path}: cannot read it as JSON" in capsys.readouterr().err


@pytest.mark.gpu
def test_tiny_kvpr_benchmark_runs_every_setting(tmp_path, capsys):
    out = tmp_path / "kvpr.json"
    main(["bench", "kvpr", "--json", str(out), "--models", "tiny-llama", "tiny-opt",
          "--batches", "4", "--contexts", "64", "--steps", "2", "--gpu-batches", "1", "2",
          "--weights", "resident", "offloaded", "--hf", "--timeline-points", "4x64"])
    result = json.loads(out.read_text())
    rows = result["rows"]
    # per model: row/1, row/2, column/2 x resident, offloaded; HF once (row/1, resident)
    assert [r["setting"] for r in rows[:len(SETTINGS) + 1]] == [*SETTINGS, HF_SETTING]
    assert len(rows) == 2 * (6 * len(SETTINGS) + 1)
    for r in rows:
        assert r["step_ms"] > 0 and r["lower_bound_ms"] > 0
        assert len(r["step_ms_runs"]) >= 2 and 1 <= len(r["warmup_ms"]) <= MAX_WARMUP_STEPS
        assert r["step_ms"] == statistics.median(r["step_ms_runs"])
        if r["setting"] != HF_SETTING:
            assert 0 <= r["overlap"] <= 1 and 0 <= r["l"] <= 64
    assert {(r["schedule"], r["gpu_batches"], r["weights"]) for r in rows} == {
        (schedule, g, weights) for schedule, g in [("row", 1), ("row", 2), ("column", 2)]
        for weights in ("resident", "offloaded")}
    assert len(result["timelines"]) == 12
    spans = result["timelines"][-1]["spans"]
    assert {s["name"] for s in spans} >= {"W_KV", "W_rest", "layer", "new token"}
    assert "kvpr-pipelined" in capsys.readouterr().out
    assert all(r["cuda_graphs"] is True for r in rows)
    assert result["git_revision"] is None or len(result["git_revision"]) == 40
    assert result["versions"]["torch"] and "clocks_start" in result and "clocks_end" in result
    main(["bench", "kvpr", "--json", str(out), "--models", "tiny-opt", "--batches", "4",
          "--contexts", "64", "--steps", "1", "--gpu-batches", "1", "--no-cuda-graphs"])
    result = json.loads(out.read_text())
    assert result["cuda_graphs"] is False and len(result["rows"]) == len(SETTINGS)
    assert all(r["cuda_graphs"] is False for r in result["rows"])
