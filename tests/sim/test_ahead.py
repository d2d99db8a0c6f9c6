"""kvlab.sim.ahead: the cross-kernel prefetch replayed through the L2 model, and the step model's
rule for it (kvlab.predict.step.ahead_hits) checked against the replay."""

import pytest

from kvlab.config import MODELS
from kvlab.predict.step import ahead_hits
from kvlab.sim import L2Cache
from kvlab.sim.ahead import ahead_hit_share

MIB = 2**20


def test_the_prefetched_share_hits_while_what_is_read_between_fits_beside_it():
    assert ahead_hit_share(32 * MIB, 0) == 0.0
    assert ahead_hit_share(32 * MIB, 16 * MIB) == pytest.approx(0.5)
    assert ahead_hit_share(32 * MIB, 64 * MIB) == pytest.approx(1.0)  # the whole weight
    assert ahead_hit_share(32 * MIB, 16 * MIB, 20 * MIB) == pytest.approx(0.5)
    assert ahead_hit_share(32 * MIB, 16 * MIB, 40 * MIB) > 0.45  # 56 of 60 MiB: most stays
    assert ahead_hit_share(32 * MIB, 16 * MIB, 60 * MIB) == 0.0  # evicted (LRU)
    assert ahead_hit_share(32 * MIB, 16 * MIB, 200 * MIB) == 0.0  # past one request's size


def test_a_given_cache_keeps_what_it_holds():
    cache = L2Cache()
    assert ahead_hit_share(8 * MIB, 0, cache=cache) == 0.0
    assert ahead_hit_share(8 * MIB, 0, cache=cache) == pytest.approx(1.0)  # read before


@pytest.mark.parametrize("model", ["llama3-8b", "qwen2.5-14b"])
@pytest.mark.parametrize("context", [512, 4096, 32768])
def test_the_step_models_rule_for_w_o_agrees_with_the_replay(model, context):
    """W_O at batch 1: prefetched by the QKV linear, the attention's K/V read before it. The
    rule (all or nothing by whether the K/V and the prefetch fit in L2) is the replay's answer
    within 5 points at 512, 4k and 32k tokens, away from the boundary."""
    ahead = 10 * MIB
    name, weight, prefetched = ahead_hits(model, 1, context, ahead)[1]
    assert name == "w_o"
    kv = 2 * 2 * context * MODELS[model].kv_size
    assert prefetched / weight == pytest.approx(ahead_hit_share(weight, ahead, kv), abs=0.05)


@pytest.mark.parametrize("args, message", [
    ((0, 16), "weight_bytes=0: must be an integer in"),
    ((16, -1), "ahead_bytes=-1: must be an integer in"),
    ((16, 16, 2.0), "between_bytes=2.0: must be an integer in"),
    ((16, 16, 0, "cache"), "cache='cache': must be a kvlab.sim.L2Cache or None"),
])
def test_bad_input_is_refused_by_name(args, message):
    with pytest.raises(ValueError, match=message):
        ahead_hit_share(*args)
