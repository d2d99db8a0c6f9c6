"""`python -m kvlab bench kvpr`: the split of each setting, bad settings (CPU), and a tiny
run of the whole harness (GPU)."""

import json
import re

import pytest
import torch

from kvlab.__main__ import main
from kvlab.bench.kvpr import (
    HF_SETTING,
    SETTINGS,
    _points,
    host_bytes,
    measure_point,
    split_for,
)
from kvlab.config import MODELS
from kvlab.offload.host import store_bytes
from kvlab.offload.model import random_layers
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
        ({"min_seconds": -1}, "min_seconds=-1: must be a number >= 0"),
        ({"schedule": "diagonal"}, "schedule='diagonal': must be one of"),
        ({"weights": "disk"}, "weights='disk': must be one of"),
        ({"hf": True, "weights": "offloaded"}, "hf=True with schedule='row', gpu_batches=1, "
                                               "weights='offloaded'"),
        ({"timeline_setting": "fast"}, "timeline_setting='fast': must be one of"),
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
        (["--gpu-batches", "0"], "gpu_batches=0: must be an integer >= 1"),
        (["--steps", "0"], "steps=0: must be an integer >= 1"),
    ],
)
def test_bad_command_lines_are_refused_before_any_gpu_work(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        main(["bench", "kvpr", "--models", "tiny-opt", *options])


def test_timeline_points_parse_or_say_what_is_allowed():
    assert _points(["16x1024", "8X512"]) == {(16, 1024), (8, 512)}
    with pytest.raises(ValueError, match="must be BATCHxCONTEXT"):
        _points(["16by1024"])


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
    main(["bench", "kvpr", "--json", str(out), "--models", "tiny-opt", "--batches", "4",
          "--contexts", "64", "--steps", "1", "--gpu-batches", "1", "--no-cuda-graphs"])
    result = json.loads(out.read_text())
    assert result["cuda_graphs"] is False and len(result["rows"]) == len(SETTINGS)
    assert all(r["cuda_graphs"] is False for r in result["rows"])
