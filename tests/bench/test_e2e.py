"""python -m kvlab bench e2e: what it counts (CPU), and a small run on a GPU."""

import json

import pytest
import torch

from kvlab.bench.cli import main
from kvlab.bench.e2e import HF_VARIANT, VARIANTS, steady_steps, step_bytes
from kvlab.config import MODELS
from kvlab.engine.weights import ModelWeights


def test_steady_steps_start_where_two_successive_steps_agree_within_5_percent():
    assert steady_steps([50.0, 20.0, 12.0, 10.4, 10.0, 10.1]) == [10.0, 10.1]
    assert steady_steps([3.0, 9.0]) == [3.0, 9.0]  # never steady: every step
    assert steady_steps([5.0]) == [5.0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
def test_a_step_reads_the_weights_and_the_batchs_kv(name):
    m = MODELS[name]
    w = ModelWeights.random(m, dtype=torch.float16)
    every = sum(t.numel() for t in (w.lm_head, w.norm_weight)) + sum(
        t.numel() for layer in w.layers
        for t in (*vars(layer.attn).values(), *vars(layer).values())
        if isinstance(t, torch.Tensor))
    rows = 3 * m.hidden_size * (2 if m.family == "opt" else 1)
    kv = 2 * m.num_layers * m.kv_size * 3 * 100
    assert step_bytes(m, w, 3, 100) == 2 * (every + rows + kv)


def test_context_beyond_the_models_limit_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "e2e", "--models", "tiny-llama", "--prompt", "500", "--new-tokens", "20"])
    assert exit_.value.code == 2
    assert "--prompt 500 + --new-tokens 20: beyond tiny-llama's context limit of 512" in \
        capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_run_times_every_variant_and_hf(tmp_path):
    out = tmp_path / "e2e.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "3", "--prompt", "20",
          "--new-tokens", "24", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["variant"], r["batch"]) for r in rows} == {
        (v, b) for v in (*VARIANTS, HF_VARIANT) for b in (1, 3)}
    for r in rows:
        assert len(r["step_ms_runs"]) == 23 and r["step_ms"] > 0 and r["roofline_ms"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / r["step_ms"] * 1e3)
