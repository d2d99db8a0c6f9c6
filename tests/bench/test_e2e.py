"""python -m kvlab bench e2e: what it counts (CPU), and a small run on a GPU."""

import json

import pytest
import torch

from kvlab.bench.cli import main
from kvlab.bench.e2e import (
    HF_VARIANT,
    VARIANTS,
    prefetch_pairs,
    report,
    steady_steps,
    step_bytes,
)
from kvlab.config import MODELS
from kvlab.engine.weights import ModelWeights


def test_steady_steps_start_where_two_successive_steps_agree_within_5_percent():
    assert steady_steps([50.0, 20.0, 12.0, 10.4, 10.0, 10.1]) == [10.0, 10.1]
    assert steady_steps([3.0, 9.0]) == [3.0, 9.0]  # never steady: every step
    assert steady_steps([5.0]) == [5.0]


def test_prefetch_pairs_each_variant_with_its_kernel_alone():
    assert prefetch_pairs([*VARIANTS, HF_VARIANT]) == [("vllm_v1+prefetch", "vllm_v1"),
                                                       ("gqa+prefetch", "gqa")]
    assert prefetch_pairs(["gqa+prefetch", HF_VARIANT]) == []


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


def test_tensor_parallel_runs_under_torchrun_over_heads_that_divide(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "2"])
    assert ("--tp 2: one process per GPU, launched as torchrun --nproc-per-node 2 -m kvlab "
            "bench e2e --tp 2 (WORLD_SIZE is unset)") in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "3"])
    assert "llama3-8b's num_kv_heads=8 does not divide by 3" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit):
        main(["bench", "e2e", "--models", "llama3-8b", "--tp", "2", "--serve-rates", "8"])
    assert "--serve-rates with --tp 2: a serving run admits requests as they arrive" in \
        capsys.readouterr().err


@pytest.mark.gpu
def test_a_small_run_times_every_variant_and_hf(tmp_path):
    out, checkpoint = tmp_path / "e2e.json", tmp_path / "checkpoint.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "3", "--prompt", "20",
          "--new-tokens", "24", "--json", str(out), "--checkpoint", str(checkpoint)])
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert json.loads(checkpoint.read_text())["rows"] == rows  # written after the last point
    assert result["async_decode"] is True
    assert {(r["variant"], r["batch"]) for r in rows} == {
        (v, b) for v in (*VARIANTS, HF_VARIANT) for b in (1, 3)}
    for r in rows:
        assert len(r["step_ms_runs"]) == 23 and r["step_ms"] > 0 and r["roofline_ms"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["batch"] / r["step_ms"] * 1e3)


@pytest.mark.parametrize(("async_decode", "said"), [
    (True, "; kvlab's steps queued ahead of the host (async decode)"),
    (False, "; each kvlab step waited for (no async decode)"),
    (None, "GB/s"),
])
def test_the_report_says_whether_steps_were_queued_ahead(async_decode, said):
    result = {"gpu": "H200", "roofline_copy_gbps": 4278.0, "rows": [], "serving": []}
    if async_decode is not None:  # older results do not say
        result["async_decode"] = async_decode
    assert report(result).splitlines()[0].endswith(said)


def test_serving_stats_from_arrival_first_and_last_tokens():
    from types import SimpleNamespace

    from kvlab.bench.e2e import serving_stats

    gen = SimpleNamespace(tokens=[[1, 2, 3], [4]], arrival_s=[0.0, 1.0],
                          first_token_s=[0.5, 1.25], finish_s=[0.7, 1.25], preemptions=2)
    stats = serving_stats(gen)
    assert stats["output_tokens"] == 4 and stats["duration_s"] == 1.25
    assert stats["output_tokens_per_s"] == pytest.approx(3.2)
    assert stats["tpot_ms_p50"] == pytest.approx(100.0)  # 0.2 s over 2 tokens; [4] has one
    assert stats["ttft_ms_p50"] == pytest.approx(375.0) and stats["preemptions"] == 2


def test_a_serving_workload_is_seeded_poisson_and_fits_the_model():
    from kvlab.bench.e2e import serving_workload

    m = MODELS["tiny-llama"]
    prompts, limits, arrivals = serving_workload(200, 20.0, m)
    again = serving_workload(200, 20.0, m)
    assert (prompts, limits, arrivals) == again
    assert all(b > a for a, b in zip(arrivals, arrivals[1:], strict=False))
    assert arrivals[-1] == pytest.approx(10.0, rel=0.3)  # 200 requests at 20/s
    assert all(len(p) + n <= m.max_position for p, n in zip(prompts, limits, strict=True))
    assert min(limits) >= 1 and max(max(p) for p in prompts) < m.vocab_size


@pytest.mark.gpu
def test_a_small_serving_run(tmp_path):
    out = tmp_path / "e2e.json"
    main(["bench", "e2e", "--models", "tiny-qwen", "--batches", "1", "--prompt", "20",
          "--new-tokens", "8", "--variants", "gqa", "--no-hf", "--serve-rates", "50",
          "--serve-requests", "24", "--no-async-decode", "--json", str(out)])
    result = json.loads(out.read_text())
    (serving,) = result["serving"]
    assert result["async_decode"] is False
    assert serving["requests"] == 24 and serving["rate"] == 50.0
    assert serving["output_tokens_per_s"] > 0 and serving["tpot_ms_p99"] >= serving["tpot_ms_p50"]
