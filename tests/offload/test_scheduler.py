"""KVPR's split point: exact integer optimum of every model of time, GQA awareness, bad input."""

import math
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.config import MODELS
from kvlab.offload.scheduler import (
    MAX_CURVE_CONTEXT,
    MODELS_OF_TIME,
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_time,
    layer_times,
    layer_weight_bytes,
    lower_bound_seconds,
    token_chunks,
    unit_shape,
)

H200 = LinkAndCompute(55.4e9, 670e12, "recorded on NVIDIA H200")
SLOW_GPU = LinkAndCompute(32e9, 20e12, "what-if")


def paper_time_by_hand(shape, rates, l):
    """The paper's formula, written out for one l with MHA or GQA sizes."""
    m, b, s, p = shape.model, shape.batch, shape.context, shape.dtype_bytes
    m_x = b * l * m.hidden_size * p
    m_kv = 2 * b * (s - l) * m.num_kv_heads * m.head_dim * p
    flops = 4 * b * l * m.hidden_size * m.num_kv_heads * m.head_dim
    recompute, copy = flops / rates.recompute_flops_per_s, m_kv / rates.h2d_bytes_per_s
    return m_x / rates.h2d_bytes_per_s + max(recompute, copy)


@pytest.mark.parametrize("rates", [H200, SLOW_GPU])
@pytest.mark.parametrize("name", ["opt-6.7b", "llama2-7b", "tiny-opt"])
def test_paper_optimum_is_the_exact_integer_minimum(name, rates):
    shape = LayerShape(MODELS[name], batch=16, context=777)
    by_hand = [paper_time_by_hand(shape, rates, l) for l in range(778)]
    assert layer_times(shape, rates) == pytest.approx(by_hand, rel=1e-12)
    split = best_split(shape, rates)
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


SMALL_KV = [name for name, m in MODELS.items() if 2 * m.kv_size <= m.hidden_size]


@pytest.mark.parametrize("model", MODELS_OF_TIME)
@pytest.mark.parametrize("name", SMALL_KV)
@pytest.mark.parametrize("batch,context", [(1, 1), (1, 512), (3, 777), (16, 1024), (64, 8192)])
def test_models_whose_kv_is_no_larger_than_x_recompute_nothing(name, batch, context, model):
    # kv <= h / 2: a recomputed token costs at least as many PCIe bytes as it saves, so even an
    # infinitely fast GPU gains nothing. At kv = h / 2 (tiny-llama) every l ties with l = 0 up
    # to float noise, and the tie goes to l = 0.
    assert {"llama3-8b", "qwen2.5-7b", "qwen2.5-14b", "tiny-llama"} <= set(SMALL_KV)
    infinite_gpu = LinkAndCompute(55.4e9, 1e30, "what-if")
    for rates in (H200, SLOW_GPU, infinite_gpu):
        split = best_split(LayerShape(MODELS[name], batch, context), rates, model)
        assert split.l == 0 and split.speedup == 1.0


def curve_optimum(shape, rates, model, num_chunks):
    """The tie rule on the whole t(l) curve: the smallest l within a relative 1e-9 of its
    minimum, and its time."""
    times = layer_times(shape, rates, model, num_chunks)
    l = int(np.flatnonzero(times <= times.min() * (1 + 1e-9))[0])
    return l, times[l], times[0]


SECONDS = st.one_of(st.just(0.0), st.floats(1e-7, 1e-2))


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    batch=st.integers(1, 64),
    context=st.integers(1, 3000),
    dtype_bytes=st.sampled_from([1, 2, 4]),
    weight_bytes=st.tuples(st.one_of(st.just(0.0), st.floats(1.0, 1e9)),
                           st.one_of(st.just(0.0), st.floats(1.0, 1e10))),
    h2d=st.floats(1e8, 1e12),
    flops=st.floats(1e9, 1e16),
    layer_seconds=SECONDS, unit_host_seconds=SECONDS, chunk_host_seconds=SECONDS,
    model=st.sampled_from(MODELS_OF_TIME),
    num_chunks=st.integers(1, 64),
)
def test_best_split_is_the_curves_optimum(name, batch, context, dtype_bytes, weight_bytes, h2d,
                                          flops, layer_seconds, unit_host_seconds,
                                          chunk_host_seconds, model, num_chunks):
    shape = LayerShape(MODELS[name], batch, context, dtype_bytes, weight_bytes)
    rates = LinkAndCompute(h2d, flops, "what-if", layer_seconds=layer_seconds,
                           unit_host_seconds=unit_host_seconds,
                           chunk_host_seconds=chunk_host_seconds)
    split = best_split(shape, rates, model, num_chunks)
    assert (split.l, split.seconds, split.full_transfer_seconds) == curve_optimum(
        shape, rates, model, num_chunks)
    assert split.seconds == layer_time(shape, rates, split.l, model, num_chunks)


@pytest.mark.parametrize("model", MODELS_OF_TIME)
def test_best_split_needs_no_curve_at_any_context(model):
    """A context of 10^12 tokens: the curve would take 8 TB, the optimum a few points. The paper's
    optimum is where T_R = T_KV, the pipelined model's where T_X + T_KV = T_R; the tie rule
    takes the first l within a relative 1e-9 of it (some 10^3 tokens before, at this context)."""
    m, s = MODELS["opt-6.7b"], 10**12
    shape = LayerShape(m, batch=1, context=s)
    split = best_split(shape, SLOW_GPU, model, 4)
    assert 0 < split.l < s and split.speedup > 1
    assert split.seconds == layer_time(shape, SLOW_GPU, split.l, model, 4)
    assert layer_time(shape, SLOW_GPU, split.l - 1, model, 4) > split.seconds
    # per token: X, K and V across the link, K and V recomputed
    v, h, kv = SLOW_GPU.h2d_bytes_per_s, m.hidden_size, m.kv_size
    x, kv_copy, r = h * 2 / v, 2 * kv * 2 / v, 4 * h * kv / SLOW_GPU.recompute_flops_per_s
    crossing = {"paper": kv_copy * s / (r + kv_copy),
                "pipelined": kv_copy * s / (r + kv_copy - x)}.get(model)
    if crossing is not None:
        best = min(layer_time(shape, SLOW_GPU, l, model, 4)
                   for l in (math.floor(crossing), math.ceil(crossing)))
        assert best <= split.seconds <= best * (1 + 1e-9)
        assert crossing - 1e-8 * s < split.l <= math.ceil(crossing)
    with pytest.raises(ValueError, match=rf"shape.context={10**12}: layer_times draws at most"):
        layer_times(shape, SLOW_GPU, model)
    assert len(layer_times(replace(shape, context=MAX_CURVE_CONTEXT), SLOW_GPU, model)) == (
        MAX_CURVE_CONTEXT + 1)


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
    with pytest.raises(ValueError, match="model_of_time=.fast."):
        best_split(LayerShape(MODELS["llama2-7b"], 1, 8), H200, "fast")
    with pytest.raises(ValueError, match="num_chunks=0"):
        layer_times(LayerShape(MODELS["llama2-7b"], 1, 8), H200, "chunked", num_chunks=0)


def test_drift_monitor_asks_for_a_new_profile_after_a_run_of_misses():
    from kvlab.offload.profiler import DriftMonitor

    monitor = DriftMonitor(tolerance=0.1, patience=3)
    # three steps set the normal ratio (1.2: the models leave attention and MLP out); then
    # within 10% of it, two misses and a hit (the run restarts), then three misses in a row
    ratios = (1.1, 1.2, 1.3, 1.25, 1.15, 1.5, 1.5, 1.2, 1.5, 0.9, 1.4)
    seen = [monitor.observe(r * 2.0, 2.0) for r in ratios]
    assert seen == [False] * 10 + [True]
    assert monitor.reference is None  # it learns the ratio afresh
    assert [monitor.observe(r, 1.0) for r in (1.5, 1.5, 1.5, 1.5)] == [False] * 4
    assert monitor.reference == 1.5
    with pytest.raises(ValueError, match="tolerance=1.5"):
        DriftMonitor(tolerance=1.5)


def lower_bound_by_hand(shape, rates, l):
    """max(PCIe bytes / v_com, recompute FLOPs / v_gpu), written out for one l."""
    m, b, s, p = shape.model, shape.batch, shape.context, shape.dtype_bytes
    h, kv = m.hidden_size, m.num_kv_heads * m.head_dim
    pcie_bytes = b * l * h * p + 2 * b * (s - l) * kv * p + sum(shape.weight_bytes)
    flops = 4 * b * l * h * kv
    return max(pcie_bytes / rates.h2d_bytes_per_s, flops / rates.recompute_flops_per_s)


@pytest.mark.parametrize("name", ["opt-6.7b", "llama3-8b", "tiny-qwen"])
def test_pipelined_model_is_the_lower_bound_and_the_fastest_prediction(name):
    m = MODELS[name]
    shape = LayerShape(m, batch=16, context=1024)
    kv, total = layer_weight_bytes(m)
    weights = LayerShape(m, batch=16, context=1024, weight_bytes=(kv, total - kv))
    busy = LinkAndCompute(55.4e9, 670e12, "what-if", layer_seconds=1e-3,
                          unit_host_seconds=2e-3, chunk_host_seconds=1e-3)
    for sh in (shape, weights):
        for rates in (H200, SLOW_GPU, busy):
            by_hand = [lower_bound_by_hand(sh, rates, l) for l in range(1025)]
            for l in (0, 1, 100, 777, 1024):
                assert lower_bound_seconds(sh, rates, l) == pytest.approx(by_hand[l], rel=1e-12)
            assert lower_bound_seconds(sh, rates) == pytest.approx(min(by_hand), rel=1e-12)
    piped = layer_times(shape, H200, "pipelined")
    for model in ("paper", "chunked"):
        assert np.all(piped <= layer_times(shape, H200, model) * (1 + 1e-12))
    # OPT-6.7B on the H200: X is half the bytes of K, V and the GPU recomputes a layer's 1k
    # tokens faster than X crosses the link, so recomputing everything wins (GQA: nothing).
    assert best_split(shape, H200, "pipelined").l == (1024 if name == "opt-6.7b" else 0)


def test_offloaded_weights_cross_the_link_w_k_w_v_first():
    m = MODELS["opt-6.7b"]
    w_kv, w_rest = 2 * m.hidden_size * m.kv_size * 2, 10 * m.hidden_size ** 2 * 2
    plain = LayerShape(m, batch=16, context=1024)
    shape = LayerShape(m, batch=16, context=1024, weight_bytes=(w_kv, w_rest))
    v = H200.h2d_bytes_per_s
    t_wk, t_wr = w_kv / v, w_rest / v
    for l in (0, 300, 1024):
        t_x = shape.activation_bytes(l) / v
        t_kv = shape.kv_bytes(l) / v
        t_r = shape.recompute_flops(l) / H200.recompute_flops_per_s
        assert layer_time(shape, H200, l) == pytest.approx(t_wk + t_x + max(t_r, t_kv + t_wr))
        assert layer_time(shape, H200, l, "pipelined") == pytest.approx(
            max(t_wk + t_x + t_kv + t_wr, t_r))
        assert layer_time(shape, H200, l, "chunked", 4) == pytest.approx(
            max(t_wk + t_x + t_kv + t_wr, t_wk + t_x / 4 + t_r, t_wk + t_x + t_r / 4))
    # the weights only add time: the same split never gets faster
    for model in ("paper", "chunked", "pipelined"):
        assert np.all(layer_times(shape, H200, model) >= layer_times(plain, H200, model))


def test_a_units_shape_follows_the_schedule_and_the_weights():
    m = MODELS["llama2-7b"]
    kv, total = layer_weight_bytes(m)
    assert kv == 2 * m.kv_size * m.hidden_size * 2 and total > 3 * kv
    assert unit_shape(m, 16, 1024) == LayerShape(m, 16, 1024)
    assert unit_shape(m, 16, 1024, "column", 4) == LayerShape(m, 4, 1024)
    # a row loads a layer once per GPU batch, a column once for all of them
    assert unit_shape(m, 16, 1024, "row", 4, "offloaded").weight_bytes == (kv, total - kv)
    assert unit_shape(m, 16, 1024, "column", 4, "offloaded").weight_bytes == (
        kv / 4, (total - kv) / 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((16, 1024, "row", 3), "gpu_batches=3: must divide batch=16"),
        ((16, 1024, "row", 0), "gpu_batches=0: must be an integer >= 1"),
        ((16, 1024, "diagonal"), "schedule='diagonal': must be one of ('row', 'column')"),
        ((16, 1024, "row", 1, "disk"), "weights='disk': must be one of ('resident', 'offloaded')"),
        ((16, 0), "context=0: must be an integer >= 1"),
    ],
)
def test_bad_units_are_refused(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        unit_shape(MODELS["opt-6.7b"], *args)


@pytest.mark.parametrize(
    "weight_bytes",
    [(1.0,), (-1.0, 0.0), (math.inf, 0.0), (0.0, math.nan), (True, 0.0), (1.0, "2"), 3.0,
     [1.0, 2.0]],
)
def test_bad_weight_bytes_are_refused(weight_bytes):
    with pytest.raises(ValueError, match=r"weight_bytes=.*: must be two finite byte counts >= 0"):
        LayerShape(MODELS["opt-6.7b"], 16, 1024, weight_bytes=weight_bytes)


@pytest.mark.parametrize("field", ["h2d_bytes_per_s", "recompute_flops_per_s", "d2h_bytes_per_s",
                                   "layer_seconds", "unit_host_seconds", "chunk_host_seconds"])
@pytest.mark.parametrize("value", [True, False, "1", 1j, None, math.inf])
def test_rates_that_are_not_real_numbers_are_refused(field, value):
    if field == "d2h_bytes_per_s" and value is None:
        return  # None: not known
    fields = {"h2d_bytes_per_s": 1e9, "recompute_flops_per_s": 1e12, "source": "x", field: value}
    with pytest.raises(ValueError, match=rf"{field}={re.escape(repr(value))}: must be a"):
        LinkAndCompute(**fields)
    # numpy's reals are real numbers
    assert LinkAndCompute(**{**fields, field: np.float32(2.0)}) == LinkAndCompute(
        **{**fields, field: 2.0})


@pytest.mark.parametrize("dtype_bytes", [True, 3, 2.0])
def test_bad_dtype_bytes_are_refused(dtype_bytes):
    with pytest.raises(ValueError, match=r"dtype_bytes=.*: must be 1, 2 or 4"):
        LayerShape(MODELS["opt-6.7b"], 16, 1024, dtype_bytes=dtype_bytes)


@pytest.mark.parametrize(
    ("l", "num_chunks", "message"),
    [
        (10, 0, "num_chunks=0: must be an integer >= 1"),
        (10, True, "num_chunks=True: must be an integer >= 1"),
        (10, 2.0, "num_chunks=2.0: must be an integer >= 1"),
        (-1, 2, "l=-1: must be an integer >= 0"),
        (2.5, 2, "l=2.5: must be an integer >= 0"),
        (True, 2, "l=True: must be an integer >= 0"),
    ],
)
def test_bad_token_chunks_are_refused(l, num_chunks, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        token_chunks(l, num_chunks)


def test_the_layers_own_work_shares_the_gpu_with_recomputation():
    shape = LayerShape(MODELS["opt-30b"], batch=8, context=512)
    bare = LinkAndCompute(55.4e9, 760e12, "what-if")
    busy = LinkAndCompute(55.4e9, 760e12, "what-if", layer_seconds=0.3e-3)
    t_l = busy.layer_seconds
    for model in ("paper", "chunked"):  # after the rest: the same optimum, t_l later
        assert np.allclose(layer_times(shape, busy, model), layer_times(shape, bare, model) + t_l)
        assert best_split(shape, busy, model).l == best_split(shape, bare, model).l
    ls = np.arange(513)
    link = (shape.activation_bytes(ls) + shape.kv_bytes(ls)) / bare.h2d_bytes_per_s
    gpu = shape.recompute_flops(ls) / bare.recompute_flops_per_s + t_l
    assert np.allclose(layer_times(shape, busy, "pipelined"), np.maximum(link, gpu))
    assert best_split(shape, busy, "pipelined").l < best_split(shape, bare, "pipelined").l
    # the lower bound leaves the layer's work out
    assert lower_bound_seconds(shape, busy) == best_split(shape, bare, "pipelined").seconds
    assert lower_bound_seconds(shape, busy, 100) == layer_time(shape, bare, 100, "pipelined")
    with pytest.raises(ValueError, match="layer_seconds=-1: must be a finite number >= 0"):
        LinkAndCompute(1e9, 1e12, "x", layer_seconds=-1)


def test_the_hosts_enqueueing_bounds_the_pipelined_model():
    """Llama-2-7B at 8 x 512 with host costs of the size measured on the H200's machine: recomputing
    anything adds chunks the host must enqueue; past a point the host, not the link, sets the
    pace, and the optimum recomputes less than the GPU alone would allow."""
    shape = LayerShape(MODELS["llama2-7b"], batch=8, context=512)
    bare = LinkAndCompute(55.4e9, 450e12, "what-if", layer_seconds=0.25e-3)
    host = replace(bare, unit_host_seconds=0.45e-3, chunk_host_seconds=0.3e-3)
    ls = np.arange(513)
    expected = np.maximum(layer_times(shape, bare, "pipelined", 4),
                          0.45e-3 + np.minimum(ls, 4) * 0.3e-3)
    assert np.allclose(layer_times(shape, host, "pipelined", 4), expected)
    gpu_only = best_split(shape, bare, "pipelined", 4)
    assert gpu_only.l > 300 and gpu_only.seconds < 0.75e-3
    # four chunks cost the host more than the link saves: almost full transfer
    four = best_split(shape, host, "pipelined", 4)
    assert four.l < 4 and four.seconds > 1.5 * gpu_only.seconds
    # one chunk: the host's 0.75 ms per unit sets the pace, just above the GPU-only optimum
    one = best_split(shape, host, "pipelined", 1)
    assert one.l > 0 and one.seconds == pytest.approx(0.45e-3 + 0.3e-3)
    for model in ("paper", "chunked"):  # the paper's models know nothing of the host
        assert np.array_equal(layer_times(shape, host, model), layer_times(shape, bare, model))
    assert lower_bound_seconds(shape, host) == lower_bound_seconds(shape, bare)
    for name in ("unit_host_seconds", "chunk_host_seconds"):
        with pytest.raises(ValueError, match=f"{name}=nan: must be a finite number >= 0"):
            LinkAndCompute(1e9, 1e12, "x", **{name: float("nan")})
