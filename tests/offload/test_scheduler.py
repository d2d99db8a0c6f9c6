"""KVPR's split point: exact integer optimum of both models of time, GQA awareness, bad input."""

import math

import numpy as np
import pytest

from kvlab.config import MODELS
from kvlab.offload.scheduler import (
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_time,
    layer_times,
    lower_bound_seconds,
)

H200 = LinkAndCompute(55.4e9, 670e12, "recorded on NVIDIA H200")
SLOW_GPU = LinkAndCompute(32e9, 20e12, "what-if")


def paper_time_by_hand(shape, hw, l):
    """The paper's formula, written out for one l with MHA or GQA sizes."""
    m, b, s, p = shape.model, shape.batch, shape.context, shape.dtype_bytes
    m_x = b * l * m.hidden_size * p
    m_kv = 2 * b * (s - l) * m.num_kv_heads * m.head_dim * p
    flops = 4 * b * l * m.hidden_size * m.num_kv_heads * m.head_dim
    recompute, copy = flops / hw.recompute_flops_per_s, m_kv / hw.h2d_bytes_per_s
    return m_x / hw.h2d_bytes_per_s + max(recompute, copy)


@pytest.mark.parametrize("hw", [H200, SLOW_GPU])
@pytest.mark.parametrize("name", ["opt-6.7b", "llama2-7b", "tiny-opt"])
def test_paper_optimum_is_the_exact_integer_minimum(name, hw):
    shape = LayerShape(MODELS[name], batch=16, context=777)
    by_hand = [paper_time_by_hand(shape, hw, l) for l in range(778)]
    assert layer_times(shape, hw) == pytest.approx(by_hand, rel=1e-12)
    split = best_split(shape, hw)
    assert split.l == int(np.argmin(by_hand)) and 0 < split.l < 777
    assert split.seconds == pytest.approx(min(by_hand))
    assert split.full_transfer_seconds == pytest.approx(by_hand[0]) and split.speedup > 1


def test_mha_with_the_paper_sizes_matches_its_formula():
    # For MHA the paper's M_KV = 2 b (s' - l) h p and N = 4 b l h^2.
    m = MODELS["opt-13b"]
    shape = LayerShape(m, batch=8, context=2048)
    l, p, b, s, h = 500, 2, 8, 2048, m.hidden_size
    v_com, v_gpu = H200.h2d_bytes_per_s, H200.recompute_flops_per_s
    recompute, copy = 4 * b * l * h * h / v_gpu, 2 * b * (s - l) * h * p / v_com
    expected = b * l * h * p / v_com + max(recompute, copy)
    assert layer_time(shape, H200, l) == pytest.approx(expected)


@pytest.mark.parametrize("model", ["paper", "chunked"])
@pytest.mark.parametrize("name", ["llama3-8b", "qwen2.5-7b", "qwen2.5-14b"])
@pytest.mark.parametrize("batch,context", [(1, 512), (16, 1024), (64, 8192)])
def test_gqa_models_recompute_nothing(name, batch, context, model):
    # kv <= h / 2: a recomputed token costs at least as many PCIe bytes as it saves, so even an
    # infinitely fast GPU gains nothing.
    m = MODELS[name]
    assert 2 * m.kv_size <= m.hidden_size
    infinite_gpu = LinkAndCompute(55.4e9, 1e30, "what-if")
    for hw in (H200, infinite_gpu):
        split = best_split(LayerShape(m, batch, context), hw, model)
        assert split.l == 0 and split.speedup == 1.0


def test_chunked_model_is_the_paper_model_with_one_chunk_and_never_slower():
    shape = LayerShape(MODELS["opt-6.7b"], batch=32, context=4096)
    paper = layer_times(shape, SLOW_GPU, "paper")
    assert layer_times(shape, SLOW_GPU, "chunked", num_chunks=1) == pytest.approx(paper)
    for n in (2, 8, 64):
        chunked = layer_times(shape, SLOW_GPU, "chunked", num_chunks=n)
        assert np.all(chunked <= paper * (1 + 1e-12))
    assert best_split(shape, SLOW_GPU, "chunked").seconds < best_split(shape, SLOW_GPU).seconds


@pytest.mark.parametrize("model", ["paper", "chunked"])
def test_no_split_beats_its_lower_bound(model):
    shape = LayerShape(MODELS["llama2-7b"], batch=16, context=1024)
    times = layer_times(shape, H200, model)
    for l in range(0, 1025, 64):
        assert times[l] >= lower_bound_seconds(shape, H200, l) * (1 - 1e-12)


def test_full_transfer_time_is_kv_bytes_over_the_link():
    m = MODELS["llama2-7b"]
    shape = LayerShape(m, batch=16, context=1024)
    # one layer of Llama-2-7B's fp16 K and V at 16 x 1k is 256 MiB: 4.85 ms at 55.4 GB/s, and
    # 155 ms for 32 layers (the anchor: "about 157 ms")
    assert layer_time(shape, H200, 0) == pytest.approx(2 * 16 * 1024 * 4096 * 2 / 55.4e9)
    assert math.isclose(layer_time(shape, H200, 0) * m.num_layers, 0.157, rel_tol=0.02)


@pytest.mark.parametrize("l", [-1, 1025, 2.5, True, "3"])
def test_split_outside_the_context_is_refused(l):
    with pytest.raises(ValueError, match=r"l=.*: must be an integer in \[0, s'=1024\]"):
        layer_time(LayerShape(MODELS["llama2-7b"], 16, 1024), H200, l)


def test_bad_shapes_and_rates_are_refused():
    with pytest.raises(ValueError, match="batch=0"):
        LayerShape(MODELS["llama2-7b"], 0, 1024)
    with pytest.raises(ValueError, match="h2d_bytes_per_s=-1"):
        LinkAndCompute(-1, 1e12, "x")
    with pytest.raises(ValueError, match="recompute_flops_per_s=nan"):
        LinkAndCompute(1e9, float("nan"), "x")
    with pytest.raises(ValueError, match="model='fast'"):
        best_split(LayerShape(MODELS["llama2-7b"], 1, 8), H200, "fast")
    with pytest.raises(ValueError, match="num_chunks=0"):
        layer_times(LayerShape(MODELS["llama2-7b"], 1, 8), H200, "chunked", num_chunks=0)


def test_drift_monitor_asks_for_a_new_profile_after_a_run_of_misses():
    from kvlab.offload.profiler import DriftMonitor

    monitor = DriftMonitor(tolerance=0.1, patience=3)
    # within 10%, then two misses and a hit (the run restarts), then three misses in a row
    seen = [monitor.observe(m, 1.0) for m in (1.05, 0.95, 1.3, 1.3, 1.0, 1.3, 0.7, 1.2)]
    assert seen == [False, False, False, False, False, False, False, True]
    assert monitor.observe(1.3, 1.0) is False  # it started over
    with pytest.raises(ValueError, match="tolerance=1.5"):
        DriftMonitor(tolerance=1.5)


def test_pipelined_model_is_the_lower_bound_and_the_fastest_prediction():
    shape = LayerShape(MODELS["opt-6.7b"], batch=16, context=1024)
    piped = layer_times(shape, H200, "pipelined")
    for l in (0, 100, 1024):
        assert piped[l] == pytest.approx(lower_bound_seconds(shape, H200, l))
    for model in ("paper", "chunked"):
        assert np.all(piped <= layer_times(shape, H200, model) * (1 + 1e-12))
    # OPT-6.7B on the H200: X is half the bytes of K, V and the GPU recomputes a layer's 1k
    # tokens faster than X crosses the link, so recomputing everything wins.
    assert best_split(shape, H200, "pipelined").l == 1024
