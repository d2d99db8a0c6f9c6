"""The cross-kernel prefetch learned from its recordings: the delivery and the issue costs
recovered from recordings made with known ones, the fits to the H100's and the H200's
recordings checked on models left out, the effect's parts, bad input."""

import pytest

from kvlab.predict.ahead import (
    KV_LEVER,
    AheadModel,
    KvAheadModel,
    ahead_effect,
    fit_ahead,
    fit_kv_ahead,
    kv_ahead_effect,
    kv_delivery,
    kv_moved_us,
    kv_pairs,
    lever_pairs,
    regime,
)
from kvlab.predict.step import StepModel, ahead_hits

STEP = StepModel(2.5, 3.6, 0.17, 16, 0.05, 0.01)
L2 = 50 * 2**20
MIB = 2**20


def counter_results(delivery: dict, model="qwen2.5-7b", ahead=10 * MIB):
    """bench steptrace --counters results whose GEMMs' hit shares rise by `delivery[regime]` of
    the share the prefetch brings, at batch 1 and 16."""
    rows = []
    for batch in (1, 16):
        hits = {name: (weight, prefetched) for name, weight, prefetched
                in ahead_hits(model, batch, 512, ahead)}
        for size in (0, ahead):
            gemms = [{"name": name, "prefetched_share": prefetched / weight if size else 0.0,
                      "load_hit_share": 0.02 + (delivery[regime(batch, weight, L2)]
                                                * prefetched / weight if size else 0.0)}
                     for name, (weight, prefetched) in hits.items()]
            rows.append({"model": model, "batch": batch, "ahead_bytes": size, "prompt": 512,
                         "counters": {"gemms": gemms}})
    return [{"rows": rows}]


def lever_results(learned: AheadModel, gbps=3000.0, ahead=8 * MIB):
    """bench e2e results whose gqa+ahead steps differ from gqa's by exactly ahead_effect's."""
    rows = []
    for model in ("llama3-8b", "qwen2.5-7b", "llama2-7b"):
        for batch in (1, 16, 64):
            delta = ahead_effect(model, batch, 640, ahead, gbps, STEP, learned)["delta_us"]
            common = {"model": model, "batch": batch, "prompt": 512, "new_tokens": 256}
            rows += [{**common, "variant": "gqa", "step_ms": 6.0},
                     {**common, "variant": "gqa+ahead", "ahead_bytes": ahead,
                      "step_ms": 6.0 + delta / 1e3}]
    return [{"roofline_copy_gbps": gbps, "rows": rows}]


def test_the_fit_recovers_the_delivery_and_costs_the_recordings_were_made_with():
    delivery = {"streaming": 0.5, "fits": 0.4, "exceeds": 0.1}
    made = AheadModel(delivery, {"streaming": 0.3, "cublas": 0.9}, L2)
    fit = fit_ahead("h100-sxm", lever_results(made), counter_results(delivery), STEP, L2)
    assert fit.delivery == pytest.approx(delivery)
    assert fit.issue_cost == pytest.approx(made.issue_cost)
    # 4 GEMMs at batch 1, 3 at 16 (not W_O); the LM head's 1% share measures no delivery
    assert fit.steps == 9 and fit.gemms == 7
    assert fit.held_out_us == pytest.approx(0, abs=1e-6) and fit.sources == ""
    assert [c["predicted_us"] for c in fit.checks] == pytest.approx(
        [c["recorded_us"] for c in fit.checks])


@pytest.mark.parametrize("gpu, steps, held_out_share", [("h100-sxm", 38, 0.02),
                                                         ("h200", 19, 0.03)])
def test_each_gpus_fit_to_its_recordings_holds_on_models_left_out(gpu, steps, held_out_share):
    fit = fit_ahead(gpu)
    assert 0.3 < fit.delivery["streaming"] < 0.6 and 0.05 < fit.delivery["exceeds"] < 0.3
    assert 0 < fit.issue_cost["streaming"] < fit.issue_cost["cublas"] < 1.5
    assert fit.steps == len(fit.checks) == steps
    misses = [abs(c["predicted_us"] - c["recorded_us"]) for c in fit.checks]
    assert fit.held_out_us == max(misses) and fit.held_out_share < held_out_share
    # held out, the learned change has the recorded one's sign wherever the recorded change is
    # 0.3% of the step or more, and at nine points in ten. h100: two misses in 38, both at
    # llama2-7b, 3,840 tokens, batch 1, +0.04% and +0.22% of its step in two recordings of that
    # change (e2e_ahead_4k, e2e_ahead_kv_4k) that differ by 0.19% of the step between them
    missed = [c for c in fit.checks if (c["predicted_us"] > 0) != (c["recorded_us"] > 0)]
    assert all(abs(c["recorded_us"]) < 0.003 * c["step_us"] for c in missed)
    assert len(missed) <= len(fit.checks) / 10
    assert "h100/steptrace_counters" in fit.sources  # the H200's delivery is the H100's


def test_on_the_h200_the_prefetch_is_learned_to_cost_more_at_batch_1_than_on_the_h100():
    """The H200's lever steps (4k and 32k tokens) lose at batch 1 where the H100's (512)
    gained: its streaming issue cost comes out above the delivered share."""
    h100, h200 = fit_ahead("h100-sxm"), fit_ahead("h200")
    assert h100.issue_cost["streaming"] < h100.delivery["streaming"]
    assert h200.issue_cost["streaming"] > h200.delivery["streaming"]


def test_the_effect_is_the_cost_less_the_hidden_idle_within_the_bound():
    learned = AheadModel({"streaming": 0.5}, {"streaming": 0.25, "cublas": 1.0}, L2)
    effect = ahead_effect("llama3-8b", 1, 512, 4 * MIB, 4000.0, STEP, learned)
    covered = 4 * 32 + 1  # every GEMM a layer and the LM head
    moved_us = 4 * MIB / 4000.0 / 1e3
    assert effect["cost_us"] == pytest.approx(covered * 0.25 * moved_us)
    assert effect["hidden_us"] == pytest.approx(covered * 0.5 * moved_us)
    assert effect["bound_us"] == pytest.approx(covered * min(2.5, moved_us))
    assert effect["delta_us"] == pytest.approx(effect["cost_us"] - effect["hidden_us"])
    # a regime no counter measured takes the median of those measured; no prefetch, no effect
    assert ahead_effect("llama3-8b", 16, 512, 4 * MIB, 4000.0, STEP, learned)[
        "hidden_us"] == pytest.approx(3 * 32 * 0.5 * moved_us + 0.5 * moved_us)
    assert set(ahead_effect("llama3-8b", 1, 512, 0, 4000.0, STEP, learned).values()) == {0.0}


def test_the_effect_splits_the_regimes_on_the_l2_it_is_given():
    """A smaller L2 puts llama3-8b's QKV weight (48 MiB) past it, where less is delivered, and
    drops W_O's prefetch at batch 1 where the layer's K/V and it no longer fit beside it."""
    learned = AheadModel({"streaming": 0.5, "fits": 0.5, "exceeds": 0.1},
                         {"streaming": 0.25, "cublas": 1.0}, 60 * MIB)
    big, small = (ahead_effect("llama3-8b", 16, 512, 4 * MIB, 4000.0, STEP, learned, l2)
                  for l2 in (None, 40 * MIB))
    assert small["hidden_us"] < big["hidden_us"] and small["cost_us"] == big["cost_us"]
    big, small = (ahead_effect("llama3-8b", 1, 12_000, 4 * MIB, 4000.0, STEP, learned, l2)
                  for l2 in (None, 40 * MIB))
    assert small["cost_us"] == pytest.approx(big["cost_us"] * (3 * 32 + 1) / (4 * 32 + 1))


def test_the_regime_is_the_linear_kind_and_the_weight_against_l2():
    assert regime(2, 10**12, L2) == "streaming"
    assert regime(3, L2, L2) == "fits" and regime(3, L2 + 1, L2) == "exceeds"


def test_bad_input_is_refused_by_name():
    learned = fit_ahead()
    with pytest.raises(ValueError, match="roofline_gbps=0"):
        ahead_effect("llama3-8b", 1, 512, MIB, 0, STEP, learned)
    with pytest.raises(ValueError, match="must be a StepModel"):
        ahead_effect("llama3-8b", 1, 512, MIB, 3000.0, None, learned)
    with pytest.raises(ValueError, match="ahead_bytes=-1"):
        ahead_effect("llama3-8b", 1, 512, -1, 3000.0, STEP, learned)
    with pytest.raises(ValueError, match="model='opt-6.7b'"):
        ahead_effect("opt-6.7b", 1, 512, MIB, 3000.0, STEP, learned)
    with pytest.raises(ValueError, match="batch='1'"):
        ahead_effect("llama3-8b", "1", 512, MIB, 3000.0, STEP, learned)
    with pytest.raises(ValueError, match="l2_bytes=0"):
        ahead_effect("llama3-8b", 1, 512, MIB, 3000.0, STEP, learned, 0)
    with pytest.raises(ValueError, match="an AheadModel with a delivery"):
        ahead_effect("llama3-8b", 1, 512, MIB, 3000.0, STEP, AheadModel({}, {}, L2))
    renamed = counter_results({"streaming": .5, "fits": .5, "exceeds": .1})
    renamed[0]["rows"][1]["counters"]["gemms"][0]["name"] = "qkv_proj"
    with pytest.raises(ValueError, match="GEMM 'qkv_proj' of qwen2.5-7b: not one of"):
        fit_ahead("h200", None, renamed, STEP)
    with pytest.raises(ValueError, match="gpu='a100'.*recorded: \\['h100-sxm', 'h200'\\]"):
        fit_ahead("a100")
    with pytest.raises(ValueError, match="e2e=5"):
        fit_ahead("h200", 5, [], STEP)
    with pytest.raises(ValueError, match="no GEMM recorded without and with"):
        fit_ahead("h200", [], [{"rows": []}], STEP)
    one_model = lever_results(learned)[0]
    one_model = [{**one_model, "rows": [r for r in one_model["rows"]
                                        if r["model"] == "llama3-8b"]}]
    with pytest.raises(ValueError, match="of 1 model"):
        fit_ahead("h200", one_model,
                  counter_results({"streaming": .5, "fits": .5, "exceeds": .1}), STEP)
    with pytest.raises(ValueError, match="l2_bytes=0"):
        fit_ahead("h200", None, None, STEP, 0)


def kv_results(net_cost: float, gbps=3000.0) -> list[dict]:
    """bench e2e results whose gqa+ahead_kv steps differ from gqa's by net_cost of the
    prefetched bytes' time, at batch 1 and 2 of three models."""
    rows = []
    for model, kv in (("llama3-8b", 3 * MIB), ("qwen2.5-7b", 8 * MIB), ("llama2-7b", 24 * MIB)):
        for batch in (1, 2):
            common = {"model": model, "batch": batch, "prompt": 512, "new_tokens": 256}
            delta = net_cost * kv_moved_us(model, batch * kv, gbps)
            rows += [{**common, "variant": "gqa", "step_ms": 6.0},
                     {**common, "variant": KV_LEVER, "ahead_kv_bytes": batch * kv,
                      "step_ms": 6.0 + delta / 1e3}]
    return [{"roofline_copy_gbps": gbps, "rows": rows}]


def test_the_kv_fit_recovers_the_net_cost_the_recordings_were_made_with():
    fit = fit_kv_ahead("h200", kv_results(0.4))
    assert fit.net_cost == pytest.approx(0.4) and fit.steps == len(fit.checks) == 6
    assert fit.held_out_us == pytest.approx(0, abs=1e-6) and fit.sources == ""
    # llama3-8b's 32 layers of 3 MiB at 3000 GB/s: 33.6 us of bytes, 0.4 of them a step
    assert kv_ahead_effect("llama3-8b", 3 * MIB, 3000.0, fit) == pytest.approx(
        0.4 * 32 * 3 * MIB / 3000.0 / 1e3)
    # the lever's pairs are read by its own size, not the weights' lever's
    assert len(lever_pairs(kv_results(0.4)[0], lever=KV_LEVER)) == 6
    assert lever_pairs(kv_results(0.4)[0]) == []


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_each_gpus_kv_prefetch_is_learned_to_cost_time_and_holds_on_models_left_out(gpu):
    """The recorded steps with the K/V blocks' prefetch are slower at every point: it moves the
    attention's bytes into a drain where HBM is busy. Learned, it costs a third to a half of
    their time, and predicts each model left out within 1.5% of its step."""
    fit = fit_kv_ahead(gpu)
    assert 0.2 < fit.net_cost < 0.6 and fit.steps == len(fit.checks) >= 6
    assert all(c["recorded_us"] > 0 and c["predicted_us"] > 0 for c in fit.checks)
    assert fit.held_out_share < 0.015 and fit.sources.startswith(gpu.split("-")[0])


def test_the_kv_models_bad_input_is_refused_by_name():
    learned = KvAheadModel(0.4)
    with pytest.raises(ValueError, match="roofline_gbps=0"):
        kv_ahead_effect("llama3-8b", MIB, 0, learned)
    with pytest.raises(ValueError, match="ahead_kv_bytes=-1"):
        kv_ahead_effect("llama3-8b", -1, 3000.0, learned)
    with pytest.raises(ValueError, match="model='gpt-5'"):
        kv_ahead_effect("gpt-5", MIB, 3000.0, learned)
    with pytest.raises(ValueError, match=r"model=\['a'\]: must be one of"):
        kv_moved_us(["a"], MIB, 3000.0)
    with pytest.raises(ValueError, match="must be a KvAheadModel"):
        kv_ahead_effect("llama3-8b", MIB, 3000.0, fit_ahead("h200"))
    with pytest.raises(ValueError, match="gpu='a100'.*recorded: \\['h100-sxm', 'h200'\\]"):
        fit_kv_ahead("a100")
    with pytest.raises(ValueError, match="e2e=5"):
        fit_kv_ahead("h200", 5)
    one_model = kv_results(0.4)[0]
    one_model["rows"] = [r for r in one_model["rows"] if r["model"] == "llama3-8b"]
    with pytest.raises(ValueError, match="steps of 1 model"):
        fit_kv_ahead("h200", [one_model])


def kv_counter_rows(model, batch, prompt, ahead_kv, share, hits, ahead=0):
    """A bench steptrace --counters row whose attention's loads hit L2 for `hits` of their
    bytes, with `share` of a layer's K/V prefetched."""
    return {"model": model, "batch": batch, "prompt": prompt, "ahead_bytes": ahead,
            "ahead_kv_bytes": ahead_kv, "counters": {"gemms": None, "attention": {
                "load_hit_share": hits, "prefetched_share": share}}}


def test_the_kv_delivery_is_the_attentions_rise_in_l2_hits_over_the_share_prefetched():
    """Pairs match on model, batch, prompt and ahead_bytes; a row ncu gave no attention hits
    pairs with nothing; the median over the pairs."""
    rows = [kv_counter_rows("llama3-8b", 1, 4064, 0, 0.0, 0.01),
            kv_counter_rows("llama3-8b", 1, 4064, 8 * MIB, 0.5, 0.21),  # 0.4
            kv_counter_rows("llama3-8b", 1, 4064, 16 * MIB, 1.0, 0.61),  # 0.6
            kv_counter_rows("llama3-8b", 2, 4064, 16 * MIB, 1.0, 0.9),  # no row without
            kv_counter_rows("qwen2.5-7b", 1, 512, 0, 0.0, None),
            kv_counter_rows("qwen2.5-7b", 1, 512, MIB, 1.0, 0.5)]  # without: no hits
    assert [(b["ahead_kv_bytes"], on["ahead_kv_bytes"]) for b, on in kv_pairs({"rows": rows})] \
        == [(0, 8 * MIB), (0, 16 * MIB)]
    assert kv_delivery([{"rows": rows}]) == (pytest.approx(0.5), 2, "")
    merged = [{**rows[0], "source": "x"}, {**rows[1], "source": "y"}]  # two recordings
    assert kv_pairs({"rows": merged}) == []
    with pytest.raises(ValueError, match="no step recorded under ncu without and with"):
        kv_delivery([{"rows": rows[3:]}])
    with pytest.raises(ValueError, match="counters=3"):
        kv_delivery(3)


def test_the_h100s_kv_counters_show_the_blocks_arrive_in_l2():
    """Recorded (h100/steptrace_kv_counters): Llama-3-8B at batch 1 on 4,064 tokens, all of a
    layer's K/V prefetched; the attention's loads hit L2 for a quarter or more of their bytes
    more than without, and less than all: the prefetch is a hint."""
    delivery, pairs, sources = kv_delivery()
    assert pairs >= 1 and sources == "h100/steptrace_kv_counters"
    assert 0.25 < delivery < 1
