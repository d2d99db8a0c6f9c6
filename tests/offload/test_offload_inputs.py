"""Hostile values at the offload runtime's entry points (the scheduler, the profiler, the host
store, the stream spans): a ValueError naming the parameter, raised before anything is allocated,
measured or written, or the right result. CPU only."""

import math
import re

import numpy as np
import pytest
import torch
from factories import no_hang

from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload import profiler
from kvlab.offload.host import HostStore, fill, store_bytes
from kvlab.offload.loop import decode
from kvlab.offload.overlap import overlap
from kvlab.offload.profiler import DriftMonitor
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import (
    LayerShape,
    LinkAndCompute,
    best_split,
    layer_time,
    layer_times,
    layer_weight_bytes,
    token_chunks,
    unit_shape,
)

TINY = MODELS["tiny-llama"]
RATES = LinkAndCompute(25e9, 100e12, "what-if")


def test_token_chunks_of_more_chunks_than_tokens_are_the_tokens_without_a_hang():
    with no_hang():
        assert token_chunks(5, 2**70) == [(i, i + 1) for i in range(5)]
        assert token_chunks(0, 2**70) == []
    assert token_chunks(5, 5) == token_chunks(5, 7) == [(i, i + 1) for i in range(5)]


@pytest.mark.parametrize("l", [2**60 + 1, 2**70 + 3, np.int64(2**62 + 1)])
def test_token_chunks_cover_every_token_of_a_huge_split(l):
    chunks = token_chunks(l, 8)
    assert chunks[0][0] == 0 and chunks[-1][1] == l
    assert all(a == b_prev for (_, b_prev), (a, _) in zip(chunks, chunks[1:], strict=False))


def test_token_chunks_keep_their_rounding():
    # round half to even, as before: 5 tokens in 2 chunks split at 2, 7 at 4
    assert token_chunks(5, 2) == [(0, 2), (2, 5)]
    assert token_chunks(7, 2) == [(0, 4), (4, 7)]
    assert token_chunks(10, 3) == [(0, 3), (3, 7), (7, 10)]


def test_a_decoder_of_a_huge_number_of_chunks_steps():
    model = TINY
    layers = random_layers(model, seed=0)
    store = HostStore(model, 2, 8, dtype=torch.float32, pinned=False)
    fill(store, layers, 4)
    decoder = KVPRDecoder(model, layers, store, "cpu", num_chunks=2**70)
    with no_hang():
        decoder.step(torch.zeros(2, model.hidden_size), 3)
    assert store.length == 5


TINY_RATES = {"link": LinkAndCompute(5e-324, 100e12, "what-if"),
              "gpu": LinkAndCompute(25e9, 5e-324, "what-if")}
HOST_BOUND = LinkAndCompute(25e9, 100e12, "what-if", unit_host_seconds=1e308,
                            chunk_host_seconds=1e308)


@pytest.mark.parametrize(("rates", "model_of_time"), [
    *((rates, model) for rates in TINY_RATES.values() for model in ("paper", "chunked",
                                                                    "pipelined")),
    (HOST_BOUND, "pipelined"),
])
def test_rates_whose_times_overflow_are_refused(rates, model_of_time):
    shape = LayerShape(MODELS["llama3-8b"], 8, 1024, weight_bytes=(1e300, 1e300))
    with np.errstate(all="raise"), pytest.raises(ValueError, match="overflow"):
        best_split(shape, rates, model_of_time)
    with np.errstate(all="raise"), pytest.raises(ValueError, match="overflow"):
        layer_time(shape, rates, 3, model_of_time)
    with np.errstate(all="raise"), pytest.raises(ValueError, match="overflow"):
        layer_times(shape, rates, model_of_time)


def test_unit_shape_names_the_batch_it_was_given():
    with pytest.raises(ValueError, match=re.escape("batch='8': must be an integer >= 1")):
        unit_shape(TINY, "8", 1024)
    with pytest.raises(ValueError, match=re.escape("batch=-4: must be an integer >= 1")):
        unit_shape(TINY, -4, 1024, gpu_batches=2)


@pytest.mark.parametrize("dtype_bytes", [0, -2, 3, True, 2.0])
def test_layer_weight_bytes_refuses_bad_element_sizes(dtype_bytes):
    with pytest.raises(ValueError, match=r"dtype_bytes=.*: must be 1, 2 or 4"):
        layer_weight_bytes(TINY, dtype_bytes)


def test_link_and_compute_keeps_python_floats_and_a_string_source():
    rates = LinkAndCompute(np.float32(25e9), np.int64(10**14), "what-if",
                           layer_seconds=np.float64(1e-3))
    assert all(type(getattr(rates, name)) is float for name in
               ("h2d_bytes_per_s", "recompute_flops_per_s", "layer_seconds"))
    with pytest.raises(ValueError, match="source=5: must be a string"):
        LinkAndCompute(25e9, 1e14, 5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tolerance": "0.1"}, "tolerance='0.1'"),
    ({"tolerance": math.nan}, "tolerance=nan"),
    ({"tolerance": True}, "tolerance=True"),
    ({"tolerance": 1.0}, "tolerance=1.0"),
])
def test_drift_monitor_refuses_bad_tolerances(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message) + ": must be a number in"):
        DriftMonitor(**kwargs)


@pytest.mark.parametrize(("measured", "predicted", "message"), [
    (math.nan, 1.0, "measured_s=nan"),
    (-1.0, 1.0, "measured_s=-1.0"),
    (0.0, 1.0, "measured_s=0.0"),
    (1.0, math.inf, "predicted_s=inf"),
    (1.0, math.nan, "predicted_s=nan"),
    (1.0, 0.0, "predicted_s=0.0"),
    (1e300, 1e-300, "measured_s / predicted_s"),
])
def test_drift_monitor_refuses_bad_times_and_keeps_its_state(measured, predicted, message):
    monitor = DriftMonitor(tolerance=0.1, patience=2)
    monitor.observe(1.0, 1.0)
    with pytest.raises(ValueError, match=re.escape(message)):
        monitor.observe(measured, predicted)
    assert monitor.reference is None
    assert monitor.observe(1.0, 1.0) is False and monitor.reference == 1.0


def test_drift_monitor_takes_numpy_times():
    monitor = DriftMonitor(tolerance=np.float32(0.1), patience=np.int64(1))
    assert monitor.observe(np.float32(2.0), np.float64(1.0)) is False
    assert monitor.reference == 2.0


@pytest.mark.parametrize(("call", "message"), [
    (lambda: profiler.profile(TINY, 0, 10, device="cpu"), "batch=0"),
    (lambda: profiler.profile(TINY, 1, 2.5, device="cpu"), "context=2.5"),
    (lambda: profiler.link_bytes_per_s("cpu", num_runs=0), "num_runs=0"),
    (lambda: profiler.link_bytes_per_s("cpu", num_bytes=True), "num_bytes=True"),
    (lambda: profiler.recompute_flops_per_s(TINY, 1, 4, "cpu", num_runs=0), "num_runs=0"),
    (lambda: profiler.layer_seconds(TINY, 1, 4, "cpu", num_runs=1.5), "num_runs=1.5"),
])
def test_profiler_checks_its_arguments_before_measuring(call, message):
    with pytest.raises(ValueError, match=re.escape(message) + ": must be an integer"):
        call()


@pytest.mark.parametrize(("args", "message"), [
    ((-1, 10), "batch=-1"), ((1, 0), "max_context=0"), ((1, 10, 3), "dtype_bytes=3"),
])
def test_store_bytes_refuses_what_no_store_holds(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        store_bytes(TINY, *args)


@pytest.mark.parametrize("budget", [math.nan, True, "1e9", -1, 1e12])
def test_store_budget_must_be_a_byte_count(budget):
    with pytest.raises(ValueError, match=re.escape(f"budget_bytes={budget!r}: must be an integer")):
        HostStore(TINY, 1, 8, pinned=False, budget_bytes=budget)


def test_store_budget_takes_numpy_integers():
    assert HostStore(TINY, 1, 8, pinned=False, budget_bytes=np.int64(10**6)).max_context == 8


@pytest.mark.parametrize("size", [10**9, 2**40])
def test_a_store_past_host_memory_is_refused_before_allocating(size):
    with pytest.raises(ValueError, match=f"batch={size}, max_context={size}: .* bytes free"):
        HostStore(TINY, size, size, pinned=False)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"context": 2.5}, "context=2.5"), ({"context": True}, "context=True"),
    ({"context": "3"}, "context='3'"), ({"context": 9}, "context=9"),
    ({"context": 3, "seed": 2.5}, "seed=2.5"), ({"context": 3, "seed": -1}, "seed=-1"),
    ({"context": 3, "seed": 2**70}, f"seed={2**70}"),
])
def test_fill_refuses_bad_lengths_and_seeds_before_writing(kwargs, message):
    layers = random_layers(TINY, seed=0)
    store = HostStore(TINY, 2, 8, dtype=torch.float32, pinned=False)
    store.k.zero_()
    with pytest.raises(ValueError, match=re.escape(message)):
        fill(store, layers, **kwargs)
    assert store.length == 0 and not store.k.any()


def test_fill_stores_a_python_length():
    layers = random_layers(TINY, seed=0)
    store = HostStore(TINY, 2, 8, dtype=torch.float32, pinned=False)
    fill(store, layers, np.int64(3))
    assert type(store.length) is int and store.length == 3


def test_overlap_of_no_spans_is_refused_by_name():
    with pytest.raises(ValueError, match=r"spans=\[\]: no operations"):
        overlap([])


def tiny_decoder(**kwargs):
    layers = random_layers(TINY, seed=0)
    store = HostStore(TINY, 2, 8, dtype=torch.float32, pinned=False)
    fill(store, layers, 4)
    return KVPRDecoder(TINY, layers, store, "cpu", **kwargs), store


@pytest.mark.parametrize("flag", ["record_spans", "cuda_graphs"])
@pytest.mark.parametrize("value", ["no", 1, None])
def test_decoder_flags_must_be_bools(flag, value):
    with pytest.raises(ValueError, match=re.escape(f"{flag}={value!r}: must be True or False")):
        tiny_decoder(**{flag: value})


def test_a_step_refuses_a_hidden_that_is_not_a_tensor_and_keeps_the_store():
    decoder, store = tiny_decoder()
    with pytest.raises(ValueError, match=r"hidden: must be a torch.Tensor"):
        decoder.step([[0.0] * TINY.hidden_size] * 2, 0)
    assert store.length == 4
    decoder.step(torch.zeros(2, TINY.hidden_size), np.int64(2))
    assert store.length == 5


def test_decoding_an_empty_store_says_to_prefill_it():
    layers = random_layers(TINY, seed=0)
    decoder = KVPRDecoder(TINY, layers, HostStore(TINY, 2, 8, dtype=torch.float32, pinned=False),
                          "cpu")
    with pytest.raises(ValueError, match=r"decoder: its stores hold no tokens; prefill them"):
        decode(decoder, torch.zeros(2, TINY.hidden_size), 1, TINY_RATES["link"])
