"""Decoding many steps with KVPR: the split chosen again at every step as the context grows, each
step timed against its prediction, and the link and GPU rates measured again when the two drift
apart (the paper profiles once, before inference, and names that as its limitation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvlab.checks import check_positive_int
from kvlab.offload.profiler import DriftMonitor, profile
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import LinkAndCompute, best_split, layer_time


@dataclass(frozen=True)
class StepRecord:
    """One decode step: the cached length it started from, the split it ran, its measured and
    predicted time, and whether the rates were profiled again after it."""

    context: int
    l: int
    measured_ms: float
    predicted_ms: float
    reprofiled: bool


def predicted_seconds(decoder: KVPRDecoder, rates: LinkAndCompute, l: int, context: int,
                      model_of_time: str = "pipelined") -> float:
    """A step's predicted time: every unit (layer, GPU batch) at split `l`."""
    per_unit = layer_time(decoder.unit_shape(context), rates, l, model_of_time, decoder.num_chunks)
    return len(decoder.units()) * per_unit


def timed_step(decoder: KVPRDecoder, hidden: torch.Tensor, l: int) -> tuple[torch.Tensor, float]:
    """One step and its seconds: CUDA events on the compute stream, the wall clock on a CPU."""
    if decoder.device.type != "cuda":
        start = time.perf_counter()
        out = decoder.step(hidden, l)
        return out, time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = decoder.step(hidden, l)
    end.record()
    end.synchronize()
    return out, start.elapsed_time(end) * 1e-3


def decode(decoder: KVPRDecoder, hidden: torch.Tensor, num_steps: int, rates: LinkAndCompute, *,
           model_of_time: str = "pipelined", monitor: DriftMonitor | None = None,
           reprofile: Callable[[], LinkAndCompute] | None = None,
           timed: Callable = timed_step) -> tuple[torch.Tensor, list[StepRecord], LinkAndCompute]:
    """`num_steps` decode steps of `decoder` from `hidden` [batch, hidden_size], each at the
    split `model_of_time` chooses for the current length under `rates`.

    monitor: compares measured with predicted step times; when it flags a drift the rates are
    measured again with `reprofile` (default: `profile` of the model on the decoder's GPU) and
    the following steps are scheduled with them. Returns (the last hidden, a StepRecord per
    step, the rates in force at the end). `timed(decoder, hidden, l) -> (hidden, seconds)` runs
    one step (CUDA events on a GPU). Raises ValueError for stores that hold no tokens yet.
    """
    check_positive_int("num_steps", num_steps)
    if decoder.stores[0].length == 0:
        raise ValueError("decoder: its stores hold no tokens; prefill them first "
                         "(kvlab.offload.host.fill)")
    if monitor is not None and reprofile is None:
        if decoder.device.type != "cuda":
            raise ValueError("reprofile=None: a CPU run needs a reprofile function to re-profile")
        def reprofile():
            store = decoder.stores[0]
            return profile(decoder.model, store.batch, max(store.length, 1), decoder.device,
                           decoder)

    records = []
    for _ in range(num_steps):
        context = decoder.stores[0].length
        l = best_split(decoder.unit_shape(context), rates, model_of_time, decoder.num_chunks).l
        hidden, seconds = timed(decoder, hidden, l)
        predicted = predicted_seconds(decoder, rates, l, context, model_of_time)
        drifted = monitor is not None and monitor.observe(seconds, predicted)
        if drifted:
            rates = reprofile()
        records.append(StepRecord(context, l, 1e3 * seconds, 1e3 * predicted, drifted))
    return hidden, records, rates
