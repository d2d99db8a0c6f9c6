"""The modelled decode step: its kernels' bytes, the three fitted constants (recovered from steps
made with known ones, and checked on the H200's recordings), the anatomy's sums, bad input."""

import numpy as np
import pytest

from kvlab.config import MAX_AHEAD_BYTES, MODELS
from kvlab.predict.step import (
    FOLDED_KEY,
    StepModel,
    ahead_hits,
    ahead_size,
    fit_step_model,
    step_anatomy,
    step_kernels,
)


@pytest.mark.parametrize("model", ["llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b"])
def test_a_steps_kernels_read_every_weight_once_and_the_kv_cache(model):
    m = MODELS[model]
    h, inter, q, kv = m.hidden_size, m.intermediate_size, m.q_size, m.kv_size
    weights = 2 * (m.num_layers * (h * (q + 2 * kv) + h * q + 3 * h * inter + 2 * h)
                   + h + m.vocab_size * h)  # the LM head whole, the embedding not
    apart = step_kernels(model, 1, 1, folded=False)
    assert len(apart) == 8 * m.num_layers + 2
    assert weights <= sum(b for _, b in apart) <= 1.001 * weights  # + one token's activations
    folded = step_kernels(model, 1, 1)  # the norms and RoPE in the linears: 5 kernels a layer
    assert len(folded) == 5 * m.num_layers + 1
    assert weights <= sum(b for _, b in folded) <= sum(b for _, b in apart)
    assert step_kernels(model, 3, 1, folded=False) == step_kernels(model, 3, 1)  # cuBLAS's
    more = sum(b for _, b in step_kernels(model, 4, 1000)) - sum(b for _, b in step_kernels(
        model, 4, 500))
    assert more == pytest.approx(2 * 2 * 4 * 500 * kv * m.num_layers)  # K and V, fp16


def synthetic_steps(streaming_us, overhead_us, per_sequence_us, gbps=4000.0, folded=True):
    """`bench e2e` results whose gqa steps are exactly the model's with the constants given
    (recorded with the norms and RoPE in the linears, or before)."""
    rows = []
    for model in ("llama3-8b", "qwen2.5-7b", "llama2-7b"):
        for batch in (1, 16, 64):
            kernels = step_kernels(model, batch, 640, folded)
            step_us = (sum(b for _, b in kernels) / gbps / 1e3
                       + (streaming_us if batch <= 2 else overhead_us) * len(kernels)
                       + per_sequence_us * batch * MODELS[model].num_layers)
            rows += [{"model": model, "variant": "gqa", "batch": batch, "prompt": 512,
                      "new_tokens": 256, "step_ms": step_us / 1e3},
                     {"model": model, "variant": "hf-static", "batch": batch, "prompt": 512,
                      "new_tokens": 256, "step_ms": 99.0}]  # not kvlab's: not fitted
    return [{"roofline_copy_gbps": gbps, "rows": rows} | ({FOLDED_KEY: True} if folded else {})]


@pytest.mark.parametrize("folded", [True, False])
def test_the_fit_recovers_the_constants_the_steps_were_made_with(folded):
    """Each recording fitted with the kernels its steps ran: the norms and RoPE in the linears
    where it says so, apart where it does not (made before)."""
    fit = fit_step_model(synthetic_steps(2.0, 3.0, 0.25, folded=folded))
    assert fit.streaming_overhead_us == pytest.approx(2.0)
    assert fit.overhead_us == pytest.approx(3.0) and fit.per_sequence_us == pytest.approx(0.25)
    assert fit.points == 9 and fit.held_out_error == pytest.approx(0, abs=1e-9)
    both = synthetic_steps(2.0, 3.0, 0.25) + synthetic_steps(2.0, 3.0, 0.25, folded=False)
    assert fit_step_model(both).streaming_overhead_us == pytest.approx(2.0)


def test_the_fit_to_the_h200s_steps_holds_on_models_left_out():
    fit = fit_step_model()
    assert 0 < fit.streaming_overhead_us < fit.overhead_us < 10 and 0 < fit.per_sequence_us < 1
    assert fit.points >= 12 and fit.median_error < 0.03 and fit.held_out_error < 0.08


def test_the_streaming_batch_is_layer_ops_own():
    from kvlab.kernels.layer_ops import LINEAR_ROWS
    from kvlab.predict.step import STREAMING_ROWS

    assert STREAMING_ROWS == LINEAR_ROWS


def test_the_anatomy_adds_up_and_grows_as_it_should():
    fit = StepModel(2.0, 3.0, 0.25, 0, 0.0, 0.0)
    one = step_anatomy("llama3-8b", 1, 640, 4000.0, fit)
    assert [k["name"] for k in one["kernels"]] == [
        "qkv", "attention", "w_o", "gate + up", "down", "lm head"]
    assert one["idle_us"] == pytest.approx(2.0 * (5 * 32 + 1))
    apart = step_anatomy("llama3-8b", 1, 640, 4000.0, fit, folded=False)
    assert [k["name"] for k in apart["kernels"]] == [
        "attention norm", "qkv", "rope + cache write", "attention", "w_o", "mlp norm",
        "gate + up", "down", "final norm", "lm head"]
    assert apart["idle_us"] == pytest.approx(2.0 * (8 * 32 + 2))
    assert one["step_us"] == pytest.approx(one["roofline_us"] + one["idle_us"]
                                           + one["per_sequence_us"])
    many = step_anatomy("llama3-8b", 64, 640, 4000.0, fit)
    assert [k["name"] for k in many["kernels"]][6:] == [  # cuBLAS: SwiGLU, the add apart
        "gate + up", "swiglu", "down", "residual add", "final norm", "lm head"]
    assert many["idle_us"] == pytest.approx(3.0 * (10 * 32 + 2))
    assert many["per_sequence_us"] == pytest.approx(64 * one["per_sequence_us"])


def test_the_cross_kernel_prefetch_hides_each_covered_gemms_overhead_at_most():
    """ahead_size is one kernel's overhead at the roofline; with it, each GEMM a kernel before
    it prefetches for (all five at a streaming batch, W_O not above it) loses its whole
    overhead; with less, the part its bytes take at the roofline; with more, no more."""
    fit = StepModel(2.0, 3.0, 0.25, 0, 0.0, 0.0)
    assert ahead_size(fit, 4000.0) == 8_000_000 and ahead_size(fit, 4000.0, 64) == 12_000_000
    assert ahead_size(fit, 4000.0 + 1e-9) % 16 == 0
    # the covered GEMMs of a step: QKV, W_O, gate + up and down a layer and the LM head at
    # batch 1; W_O not at batch 64
    for batch, gemms, overhead in ((1, 4 * 32 + 1, 2.0), (64, 3 * 32 + 1, 3.0)):
        plain = step_anatomy("llama3-8b", batch, 640, 4000.0, fit)
        size = ahead_size(fit, 4000.0, batch)
        full = step_anatomy("llama3-8b", batch, 640, 4000.0, fit, size)
        assert plain["idle_us"] - full["idle_us"] == pytest.approx(overhead * gemms)
        assert step_anatomy("llama3-8b", batch, 640, 4000.0, fit, 10 * size)[
            "idle_us"] == pytest.approx(full["idle_us"])
        half = step_anatomy("llama3-8b", batch, 640, 4000.0, fit, size // 2)
        assert plain["idle_us"] - half["idle_us"] == pytest.approx(overhead * gemms / 2, rel=1e-6)
        w_o = {k["name"]: k for k in full["kernels"]}["w_o"]
        assert (w_o["idle_us"] == 0) is (batch == 1)


def test_each_gemm_gets_the_prefetch_of_the_kernel_before_it():
    """At batch 1 every GEMM, W_O only while the layer's K/V that the attention reads between
    fit in L2 beside it; above batch 2 all but W_O."""
    one, many = (ahead_hits("llama3-8b", b, 640, 8 << 20) for b in (1, 64))
    assert [n for n, _, _ in one[:5]] == ["qkv", "w_o", "gate + up", "down", "qkv"]
    assert len(one) == len(many) == 4 * 32 + 1 and one[-1][0] == "lm head"
    assert one[0] == ("qkv", 2 * 6144 * 4096, 8 << 20) and one[1][2] == 8 << 20
    assert [p for _, _, p in many[:4]] == [8 << 20, 0, 8 << 20, 8 << 20]
    assert all(p == w for _, w, p in ahead_hits("llama3-8b", 1, 640, 1 << 30, 1 << 40))
    kv = 2 * 2 * 32768 * 1024  # llama3-8b at 32k: 128 MiB of K/V a layer, past a 60 MiB L2
    long = ahead_hits("llama3-8b", 1, 32768, 8 << 20)
    assert long[1] == ("w_o", 2 * 4096 * 4096, 0) and long[0][2] == 8 << 20
    assert ahead_hits("llama3-8b", 1, 32768, 8 << 20, kv + (8 << 20))[1][2] == 8 << 20
    with pytest.raises(ValueError, match="ahead_bytes=-5: must be an integer >= 0"):
        ahead_hits("llama3-8b", 1, 640, -5)
    with pytest.raises(ValueError, match="l2_bytes=0: must be an integer >= 1"):
        ahead_hits("llama3-8b", 1, 640, 5, 0)


@pytest.mark.parametrize("args, message", [
    (("opt-6.7b", 1, 10), "model='opt-6.7b': must be a Llama or Qwen2 preset"),
    (("gpt-5", 1, 10), "model='gpt-5'"),
    (("llama3-8b", 0, 10), "batch=0: must be an integer >= 1"),
    (("llama3-8b", 2.0, 10), "batch=2.0: must be an integer >= 1"),
    (("llama3-8b", 1, 0), "context=0: must be a finite number > 0"),
    (("llama3-8b", 1, float("inf")), "context=inf"),
    (("llama3-8b", 1, True), "context=True"),
])
def test_bad_input_is_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        step_kernels(*args)


def test_the_anatomy_refuses_a_bad_roofline_or_fit_and_the_fit_needs_two_models():
    fit = StepModel(2.0, 3.0, 0.25, 0, 0.0, 0.0)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=rf"ahead_bytes={bad!r}: must be an integer >= 0"):
            step_anatomy("llama3-8b", 1, 640, 4000.0, fit, bad)
    assert step_anatomy("llama3-8b", 1, 640, 4000.0, fit, np.int64(64))["hidden_us"] > 0
    for args, message in ((("gpt-5", 1), "model='gpt-5': must be a Llama or Qwen2 preset"),
                          (("llama3-8b", "x"), "batch='x': must be an integer >= 1"),
                          (("llama3-8b", None), "batch=None: must be an integer >= 1")):
        with pytest.raises(ValueError, match=message):  # before anything reads them
            step_anatomy(*args, 640, 4000.0, fit, 64)
    with pytest.raises(ValueError, match=r"batch=0: must be an integer >= 1"):
        ahead_size(fit, 4000.0, 0)
    assert ahead_size(StepModel(-1.0, -1.0, 0.0, 0, 0.0, 0.0), 4000.0) == 0
    assert ahead_size(fit, 1e300) == MAX_AHEAD_BYTES  # the most kvlab.LLM takes
    as_numpy = step_anatomy("llama3-8b", np.int64(1), np.float32(640), np.float32(4000), fit)
    assert as_numpy == step_anatomy("llama3-8b", 1, 640.0, 4000.0, fit)
    with pytest.raises(ValueError, match=r"fit='x': must be a StepModel"):
        ahead_size("x", 4000.0)
    with pytest.raises(ValueError, match=r"roofline_gbps=-1: must be a finite number > 0"):
        step_anatomy("llama3-8b", 1, 640, -1, StepModel(2.0, 3.0, 0.25, 0, 0.0, 0.0))
    with pytest.raises(ValueError, match=r"fit=None: must be a StepModel"):
        step_anatomy("llama3-8b", 1, 640, 4000.0, None)
    with pytest.raises(ValueError, match=r"model=\['x'\]: must be a Llama or Qwen2 preset"):
        step_kernels(["x"], 1, 10)
    for results in ("abc", [{"rows": []}], None.__class__):
        with pytest.raises(ValueError, match=r"must be a list of bench e2e results"):
            fit_step_model(results)
    one = synthetic_steps(2.0, 3.0, 0.25)[0]
    one["rows"] = [r for r in one["rows"] if r["model"] == "llama3-8b"]
    with pytest.raises(ValueError, match=r"steps of 1 model\(s\): the fit needs two or more"):
        fit_step_model([one])
