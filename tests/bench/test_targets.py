"""`meets_target` of the CPU benchmarks (bench cache, bench l2sim) on synthetic rates just above
and just below their targets: the timing functions replaced, the verdict computed by `run`."""

from types import SimpleNamespace

import pytest

from kvlab.bench import cache, l2sim


@pytest.fixture
def one_core(monkeypatch):
    for module in (cache, l2sim):
        monkeypatch.setattr(module, "pin_to_one_core", lambda: 0)


@pytest.mark.parametrize(("rate", "meets"), [
    (cache.TARGET_PAIRS_PER_S * 1.001, True), (cache.TARGET_PAIRS_PER_S, True),
    (cache.TARGET_PAIRS_PER_S * 0.999, False)])
def test_the_pool_meets_its_target_at_or_above_it(monkeypatch, one_core, rate, meets):
    # the batched calls are fast either way: the target is on allocate(1) + free alone
    monkeypatch.setattr(cache, "_time_pool_pairs",
                        lambda per_call, *_: rate if per_call == 1 else 100 * rate)
    monkeypatch.setattr(cache, "_time_sequences", lambda **_: 1.0)
    result = cache.run(SimpleNamespace(quick=True))
    assert result["meets_target"] is meets
    assert ("meets" if meets else "MISSES") + " the 500,000/s target" in cache.report(result)


@pytest.mark.parametrize(("cache_rate", "simulate_rate", "meets"), [
    (1.01, 1.01, True), (1.0, 5.0, True),
    (0.99, 5.0, False),  # the L2 cache alone too slow
    (5.0, 0.99, False),  # the whole simulation too slow
])
def test_the_l2_model_meets_its_target_only_when_both_rates_do(monkeypatch, one_core,
                                                               cache_rate, simulate_rate, meets):
    target = l2sim.TARGET_SECTORS_PER_S
    monkeypatch.setattr(l2sim, "cache_rate", lambda *_: cache_rate * target)
    monkeypatch.setattr(l2sim, "simulate_rate", lambda *_: simulate_rate * target)
    result = l2sim.run(SimpleNamespace(quick=True))
    assert result["meets_target"] is meets
    assert ("meets" if meets else "MISSES") in l2sim.report(result).splitlines()[-1]
