"""Decode steps timed at steady state and in turn, and HF's cache given back its tensors after
each step (CPU, with fake steps)."""

import torch

from kvlab.bench.steps import (
    MAX_STEPS,
    MAX_WARMUP_STEPS,
    cache_tensors,
    restore_cache_tensors,
    time_in_turn,
)


def stepper(times):
    """A step callable returning `times` one after another, logging its calls."""
    it = iter(times)
    return lambda: next(it)


def test_settings_warm_up_until_two_steps_agree_then_take_turns():
    calls = []

    def logged(name, times):
        step = stepper(times)
        return lambda: calls.append(name) or step()

    steps = {"kvpr": logged("kvpr", [30.0, 20.0, 20.5] + [20.0] * 20),
             "hf": logged("hf", [404.7, 224.7, 183.3, 180.0] + [179.0] * 20)}
    timed = time_in_turn(steps, min_rounds=3, min_seconds=0.0)
    assert timed["kvpr"]["warmup_ms"] == [30.0, 20.0, 20.5]  # 20.0, 20.5: within 5%
    assert timed["hf"]["warmup_ms"] == [404.7, 224.7, 183.3, 180.0]
    assert timed["kvpr"]["steady"] and timed["hf"]["steady"]
    assert timed["hf"]["step_ms_runs"] == [179.0] * 3
    # warm-up: both, then HF alone; then rounds in turn
    assert calls == ["kvpr", "hf"] * 3 + ["hf"] + ["kvpr", "hf"] * 3


def test_short_steps_get_more_rounds_and_a_setting_that_never_settles_says_so():
    steps = {"fast": stepper([1.0] * 100), "noisy": stepper([10.0, 20.0] * 100)}
    timed = time_in_turn(steps, min_rounds=2, min_seconds=0.025)
    assert len(timed["noisy"]["warmup_ms"]) == MAX_WARMUP_STEPS
    assert not timed["noisy"]["steady"] and timed["fast"]["steady"]
    assert len(timed["fast"]["step_ms_runs"]) == 25  # 25 x 1 ms reach 0.025 s
    assert len(timed["noisy"]["step_ms_runs"]) == 25  # every setting takes every round
    capped = time_in_turn({"fast": stepper([1.0] * 100)}, min_rounds=1, min_seconds=10.0)
    assert len(capped["fast"]["step_ms_runs"]) == MAX_STEPS


def test_hf_cache_gets_back_the_very_tensors_it_held_before_a_step():
    import transformers

    cache = transformers.DynamicCache()
    for layer in range(2):
        cache.update(torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8), layer)
    before = cache_tensors(cache)
    for layer in range(2):  # a decode step: one token more, new tensors
        cache.update(torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8), layer)
    assert cache.get_seq_length() == 8
    restore_cache_tensors(cache, before)
    assert cache.get_seq_length() == 7
    assert all(layer.keys is k and layer.values is v
               for layer, (k, v) in zip(cache.layers, before, strict=True))
