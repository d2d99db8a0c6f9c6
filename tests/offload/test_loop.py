"""Decoding many steps: the split follows the context and the rates, and a drift between measured
and predicted step times brings a new profile that the next steps use."""

import pytest
import torch
from factories import make_cpu_stores, placed

from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.loop import decode, predicted_seconds
from kvlab.offload.profiler import DriftMonitor
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import LinkAndCompute, best_split

SLOW_GPU = LinkAndCompute(55e9, 1e9, "what-if")  # recomputing is never worth it
FAST_GPU = LinkAndCompute(55e9, 1e18, "what-if")  # recomputing everything is free


def decoder(weights="resident", schedule="row", gpu_batches=1):
    model = MODELS["tiny-opt"]
    layers = random_layers(model, seed=3)
    stores = make_cpu_stores(model, layers, gpu_batches, 2, 40, 20)
    return KVPRDecoder(model, placed(layers, weights), stores, "cpu", num_chunks=2,
                       schedule=schedule)


def scripted(seconds):
    """A `timed` that runs the step and reports the next scripted duration."""
    durations = iter(seconds)

    def timed(dec, hidden, l):
        return dec.step(hidden, l), next(durations)

    return timed


def test_the_split_follows_the_rates_and_the_context():
    dec = decoder()
    hidden = torch.zeros(2, dec.model.hidden_size)
    _, records, _ = decode(dec, hidden, 3, SLOW_GPU)
    assert [r.l for r in records] == [0, 0, 0] and [r.context for r in records] == [20, 21, 22]
    _, records, _ = decode(dec, hidden, 2, FAST_GPU)
    assert [r.l for r in records] == [23, 24]  # l = s': every cached token recomputed
    assert all(r.measured_ms > 0 and not r.reprofiled for r in records)


def test_a_drift_brings_a_new_profile_used_from_the_next_step():
    dec = decoder()
    hidden = torch.zeros(2, dec.model.hidden_size)
    predicted = predicted_seconds(dec, SLOW_GPU, 0, 20)
    # 3 steps at 1.2x the prediction set the normal ratio, then 3 at 2x: drift
    seconds = [1.2 * predicted] * 3 + [2.0 * predicted] * 3 + [1.2 * predicted] * 2
    profiles = []

    def reprofile():
        profiles.append(FAST_GPU)
        return FAST_GPU

    _, records, rates = decode(dec, hidden, 8, SLOW_GPU, monitor=DriftMonitor(0.1, 3),
                            reprofile=reprofile, timed=scripted(seconds))
    assert [r.reprofiled for r in records] == [False] * 5 + [True, False, False]
    assert len(profiles) == 1 and rates is FAST_GPU
    assert [r.l for r in records[:6]] == [0] * 6  # scheduled with the old rates
    assert [r.l for r in records[6:]] == [26, 27]  # and with the new ones


def test_a_cpu_run_with_a_monitor_needs_a_reprofile_function():
    dec = decoder()
    with pytest.raises(ValueError, match="reprofile=None: a CPU run needs"):
        decode(dec, torch.zeros(2, dec.model.hidden_size), 1, SLOW_GPU, monitor=DriftMonitor())
    with pytest.raises(ValueError, match="num_steps=0"):
        decode(dec, torch.zeros(2, dec.model.hidden_size), 0, SLOW_GPU)


@pytest.mark.parametrize("schedule", ["row", "column"])
def test_offloaded_weights_enter_the_prediction_shared_by_a_column(schedule):
    dec = decoder("offloaded", schedule, gpu_batches=2)
    packing = dec.layers.packing
    share = 2 if schedule == "column" else 1
    shape = dec.unit_shape(20)
    assert shape.weight_bytes == (packing.kv_bytes / share,
                                  (packing.num_bytes - packing.kv_bytes) / share)
    assert shape.batch == 2 and shape.dtype_bytes == 4
    resident = decoder("resident", schedule, gpu_batches=2)
    assert best_split(shape, SLOW_GPU).seconds > best_split(resident.unit_shape(20),
                                                            SLOW_GPU).seconds
    per_unit = best_split(shape, SLOW_GPU, "pipelined", 2).seconds
    assert predicted_seconds(dec, SLOW_GPU, 0, 20) == pytest.approx(4 * per_unit)
