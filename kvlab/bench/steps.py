"""Timing decode steps the way `python -m kvlab bench kvpr` does: every setting warmed up to a
steady state, then all timed in turn, round by round (`time_in_turn`); and HF transformers'
offloaded KV cache as one of those settings (`HFSteps`), each step from the same cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WARMUP_TOLERANCE = 0.05  # a setting is warm once two successive steps agree within this
MAX_WARMUP_STEPS = 12
MAX_STEPS = 40


def is_warm(steps_ms: list[float]) -> bool:
    """Whether the last two steps agree within WARMUP_TOLERANCE (of the smaller)."""
    return len(steps_ms) >= 2 and (
        abs(steps_ms[-1] - steps_ms[-2]) <= WARMUP_TOLERANCE * min(steps_ms[-2:]))


def time_in_turn(steps: dict[str, Callable[[], float]], min_rounds: int, min_seconds: float,
                 progress=None) -> dict[str, dict]:
    """Time decode steps of several settings at steady state, in turn.

    steps: setting -> a callable that runs one step and returns its ms. Each setting first warms
    up until `is_warm` (at most MAX_WARMUP_STEPS steps; a warm setting waits for the others).
    Then rounds in which every setting takes one step: at least `min_rounds`, more (up to
    MAX_STEPS) while a setting's timed steps add up to less than `min_seconds`. Returns, per
    setting, {"warmup_ms": [...], "steady": bool, "step_ms_runs": [...]}. progress(done, planned)
    is called after every step (planned grows when warm-up or rounds run longer)."""
    warmup = {setting: [] for setting in steps}
    timed = {setting: [] for setting in steps}
    done = 0

    def run(setting: str, into: list) -> None:
        nonlocal done
        into.append(steps[setting]())
        done += 1
        if progress is not None:
            cold = sum(not is_warm(w) and len(w) < MAX_WARMUP_STEPS for w in warmup.values())
            left = max(min_rounds - len(timed[setting]), 0) * len(steps)
            progress(done, done + cold + left)

    while cold := [s for s, w in warmup.items() if not is_warm(w) and len(w) < MAX_WARMUP_STEPS]:
        for setting in cold:
            run(setting, warmup[setting])
    rounds = 0
    while rounds < min_rounds or (rounds < MAX_STEPS and any(
            sum(t) < 1e3 * min_seconds for t in timed.values())):
        for setting in steps:
            run(setting, timed[setting])
        rounds += 1
    return {s: {"warmup_ms": warmup[s], "steady": is_warm(warmup[s]), "step_ms_runs": timed[s]}
            for s in steps}


class HFSteps:
    """HF transformers' offloaded KV cache (`DynamicCache(offloading=True)`, what
    `cache_implementation="offloaded"` builds) on the causal LM of `model` sharing `layers`'
    tensors (positions up to `max_position`), prefilled with `context` random tokens per sequence.
    Each call runs one decode step,
    timed with CUDA events, then puts back the K, V tensors the cache held before it, so that
    every step starts from the same cache (as the KVPR settings start from the same cached
    length); returns its ms."""

    def __init__(self, model, layers, batch: int, context: int, max_position: int):
        import transformers

        from kvlab.model.hf import cache_keyword, causal_lm

        self.hf = causal_lm(model, layers, "cuda", max_position=max_position)
        self.cache = transformers.DynamicCache(config=self.hf.config, offloading=True)
        gen = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.randint(model.vocab_size, (batch, context + 1), device="cuda", generator=gen)
        self.kwargs = {cache_keyword(self.hf): self.cache, "use_cache": True}
        self.next_ids = ids[:, context:]
        with torch.no_grad():
            self.hf(input_ids=ids[:, :context], logits_to_keep=1, **self.kwargs)
        torch.cuda.synchronize()

    def __call__(self) -> float:
        before = cache_tensors(self.cache)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            start.record()
            self.hf(input_ids=self.next_ids, **self.kwargs)
            end.record()
        torch.cuda.synchronize()  # HF's copies on its own streams too
        restore_cache_tensors(self.cache, before)
        return start.elapsed_time(end)


def cache_tensors(cache) -> list[tuple]:
    """Every layer's (K, V) tensors of an HF cache: the objects themselves, not copies."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def restore_cache_tensors(cache, tensors: list[tuple]) -> None:
    """Give an HF cache back the (K, V) tensors `cache_tensors` took from it: the state before
    the steps since, down to where each tensor lives and whether it is pinned. (Cropping instead
    leaves strided views, or unpinned copies, that the offloaded cache's next step would copy
    to the GPU at the pageable rate: a cost HF's own decoding never pays.)"""
    for layer, (keys, values) in zip(cache.layers, tensors, strict=True):
        layer.keys, layer.values = keys, values
