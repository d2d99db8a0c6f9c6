"""kvlab.sim refuses what it cannot model, naming the parameter, before any allocation: shapes
past its memory limits, hostile numbers, wrong types (CPU)."""

import math
import re

import numpy as np
import pytest
from factories import no_hang

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim import L2Cache, L2Result, TraceSpec, simulate
from kvlab.sim import l2 as l2_module
from kvlab.sim.l2 import MAX_CACHE_BYTES, MAX_REQUEST_BYTES, NUM_SETS, NUM_WAYS
from kvlab.sim.plan import launch_spec
from kvlab.sim.spec import MAX_TRACE_BYTES, iterations_per_cta, schedule
from kvlab.sim.time_model import TimeModel, copy_roofline_gbps
from kvlab.sim.trace import MAX_CHUNK_ITERATIONS, iter_requests, requests

NONE = PrefetchConfig()
MODEL = TimeModel(50.0, {"gqa": 0.8}, {"gqa": 10.0})
MEASURED = {32: 2000.0, 132: 4300.0}


def make_spec(**fields) -> TraceSpec:
    defaults = dict(family="gqa", num_seqs=2, context=97, num_qo_heads=8, num_kv_heads=2,
                    partition_size=0, ctas_per_sm=2, num_sms=2)
    return TraceSpec(**{**defaults, **fields})


@pytest.fixture
def no_big_arrays(monkeypatch):
    """numpy's allocators refuse anything over 64 MiB while a test runs (an old, unbounded
    allocation fails the test instead of the machine)."""
    for name in ("empty", "zeros", "full"):
        real = getattr(np, name)

        def bounded(shape, *args, _real=real, **kwargs):
            if np.prod(shape, dtype=np.float64) * 8 > 64 * 2**20:
                raise AssertionError(f"allocated an array of shape {shape}")
            return _real(shape, *args, **kwargs)

        monkeypatch.setattr(np, name, bounded)


# -- the trace's memory ------------------------------------------------------------------------

def test_a_trace_past_the_memory_limit_is_refused_at_once():
    with pytest.raises(ValueError, match=r"num_seqs=1000, context=16000000: the trace .* more "
                                         r"than MAX_TRACE_BYTES = 512 MiB"):
        make_spec(num_seqs=1000, context=16_000_000, num_qo_heads=32, num_kv_heads=8)


@pytest.mark.parametrize("fields", [
    dict(num_seqs=2**40),
    dict(context=2**62),
    dict(family="vllm_v1", num_qo_heads=2**40, num_kv_heads=1),
    dict(num_qo_heads=2**34, num_kv_heads=2**31),
    dict(partition_size=64, context=2**30),  # a CTA per 64 tokens
])
def test_every_way_to_a_huge_trace_is_refused(fields):
    with pytest.raises(ValueError, match="MAX_TRACE_BYTES"):
        make_spec(**fields)


def test_too_many_cta_slots_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"num_sms=1099511627776 x ctas_per_sm=2: .*MAX_TRACE"):
        make_spec(num_sms=2**40)


@pytest.mark.parametrize("fields", [
    dict(),
    dict(family="vllm_v1", num_qo_heads=4, partition_size=32, context=1000),
    dict(partition_size=128, warps=8, context=1000, num_seqs=3),
    dict(partition_size=64, context=64),
])
def test_the_counted_iterations_are_the_built_ones(fields):
    spec = make_spec(**fields)
    assert spec.num_iterations == iterations_per_cta(spec).sum()
    assert spec.trace_bytes < MAX_TRACE_BYTES


def test_the_largest_recorded_launches_fit():
    for kernel in ("vllm_v1", "gqa"):
        spec = launch_spec("qwen2.5-14b", kernel, 64, 32768, 132, NONE)
        assert spec.trace_bytes < MAX_TRACE_BYTES


def test_schedule_refuses_bad_steps_and_slots():
    with pytest.raises(ValueError, match=re.escape("num_slots=0: must be an integer >= 1")):
        schedule(np.array([1, 2]), 0)
    with pytest.raises(ValueError, match=re.escape("steps[1]=-1: must be >= 0")):
        schedule(np.array([1, -1]), 1)
    with pytest.raises(ValueError, match=re.escape("steps: dtype=float64, shape=(1,)")):
        schedule(np.array([1.0]), 1)
    with pytest.raises(ValueError, match="CTA iterations on num_slots=1: .*MAX_TRACE_BYTES"):
        schedule(np.array([2**62]), 1)
    with pytest.raises(ValueError, match="MAX_TRACE_BYTES"):
        schedule(np.array([1]), 2**40)


def test_chunks_are_bounded_and_checked_at_the_call():
    spec = make_spec()
    for bad in (0, MAX_CHUNK_ITERATIONS + 1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_iterations="):
            iter_requests(spec, bad)  # at the call, not at the first chunk
    with pytest.raises(ValueError, match=r"num_seqs=64, context=1000000: the whole trace"):
        requests(make_spec(num_seqs=64, context=1_000_000))


def test_simulate_and_the_trace_take_a_spec_and_a_cache():
    with pytest.raises(ValueError, match=re.escape("spec='gqa': must be a kvlab.sim.TraceSpec")):
        simulate("gqa")
    with pytest.raises(ValueError, match=re.escape("cache=64: must be a kvlab.sim.L2Cache")):
        simulate(make_spec(), 64)
    with pytest.raises(ValueError, match="spec=None"):
        iter_requests(None)
    with pytest.raises(ValueError, match="spec=None"):
        requests(None)


@pytest.mark.parametrize(("fields", "message"), [
    ({"dtype_bytes": 2.0}, "dtype_bytes=2.0: must be an integer >= 1"),
    ({"dtype_bytes": True}, "dtype_bytes=True: must be an integer >= 1"),
    ({"warps": 8.0}, "warps=8.0: must be an integer >= 1"),
    ({"family": ["gqa"]}, "family=['gqa']: must be one of"),
    ({"placement": np.array(["random", "contiguous"])}, "placement=array("),
])
def test_fields_of_the_wrong_type_are_refused(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_spec(**fields)


def test_numpy_fields_are_taken_as_plain_numbers():
    spec = make_spec(dtype_bytes=np.int64(2), num_seqs=np.int32(2), warps=np.int64(8))
    assert (type(spec.dtype_bytes), type(spec.warps), spec.tile_bytes) == (int, int, 4096)


# -- the cache ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("num_sets", "num_ways"), [(2**26, 16), (NUM_SETS, 2**20), (2**31, 1)])
def test_a_cache_past_the_memory_limit_is_refused_before_allocating(no_big_arrays, num_sets,
                                                                    num_ways):
    with pytest.raises(ValueError, match=f"num_sets={num_sets} x num_ways={num_ways}: the cache's "
                                         r"state would take .* more than MAX_CACHE_BYTES"):
        L2Cache(num_sets=num_sets, num_ways=num_ways)


def test_the_h200_cache_fits():
    assert NUM_SETS * NUM_WAYS * l2_module._WAY_STATE_BYTES < MAX_CACHE_BYTES
    L2Cache()


def test_a_set_index_of_another_type_is_refused():
    with pytest.raises(ValueError, match=re.escape("set_index=array(['hash', 'x']")):
        L2Cache(4, 2, np.array(["hash", "x"]))


@pytest.mark.parametrize(("addrs", "nbytes", "kinds", "message"), [
    ([2**63 - 1], 32, 0, "addrs=9223372036854775807: must be <= 4611686018427387904"),
    (np.array([2**64 - 1], dtype=np.uint64), 32, 0, "addrs=18446744073709551615: must be <="),
    ([0], np.array([2**64 - 1], dtype=np.uint64), 0, "nbytes=18446744073709551615: must be <="),
    ([0], MAX_REQUEST_BYTES + 1, 0, f"nbytes={MAX_REQUEST_BYTES + 1}: must be <= "
                                    f"{MAX_REQUEST_BYTES}"),
    ([0], 32, np.array([2**64 - 1], dtype=np.uint64), "kinds=18446744073709551615: must be <="),
    ([2**62 - 32], 64, 0, "addrs + nbytes=4611686018427387936: must be < 2**62"),
])
def test_requests_past_the_limits_leave_the_cache_unchanged(no_big_arrays, addrs, nbytes, kinds,
                                                            message):
    cache = L2Cache(4, 2, "modulo", 0)
    cache.access([0, 128], 128, 0)
    with pytest.raises(ValueError, match=re.escape(message)):
        cache.access(addrs, nbytes, kinds)
    assert cache.access([0, 128], 128, 0) == L2Result(demand_hits=8)  # still there, still usable


def test_a_request_of_the_largest_size_is_replayed():
    result = L2Cache().access([0], MAX_REQUEST_BYTES, 0)
    assert result.demand_misses == MAX_REQUEST_BYTES // 32


# -- the time model ----------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (("gqa", 1e9, 1e9, 0, 4000.0), "num_sms=0: must be an integer >= 1"),
    (("gqa", 1e9, 1e9, 13.5, 4000.0), "num_sms=13.5: must be an integer >= 1"),
    (("gqa", 1e9, 1e9, True, 4000.0), "num_sms=True: must be an integer >= 1"),
    (("gqa", 1e9, 1e9, 132, 0.0), "roofline_gbps=0.0: must be a finite number > 0"),
    (("gqa", 1e9, 1e9, 132, math.inf), "roofline_gbps=inf: must be a finite number > 0"),
    (("gqa", -1e9, 1e9, 132, 4000.0), "dram_bytes=-1000000000.0: must be a finite number >= 0"),
    (("gqa", math.nan, 1e9, 132, 4000.0), "dram_bytes=nan: must be a finite number >= 0"),
    (("gqa", 1e9, math.nan, 132, 4000.0), "load_bytes=nan: must be a finite number >= 0"),
    ((["gqa"], 1e9, 1e9, 132, 4000.0), "family=['gqa']: the time model is fitted for"),
])
def test_predict_refuses_what_it_cannot_time(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MODEL.predict_ms(*args)


def test_predict_takes_numpy_numbers():
    assert MODEL.predict_ms("gqa", np.float64(4e9), np.int64(4e9), np.int64(132),
                            np.float32(4000.0)) == pytest.approx(1 / 0.8 + 0.010)


def test_predict_result_takes_a_result():
    with pytest.raises(ValueError, match=re.escape("result={}: must be a kvlab.sim.L2Result")):
        MODEL.predict_result_ms("gqa", {}, 132, 4000.0)


@pytest.mark.parametrize(("args", "message"), [
    ((0.0, {"gqa": 0.8}, {"gqa": 10.0}), "l2_gbps_per_sm=0.0: must be a finite number > 0"),
    ((math.nan, {"gqa": 0.8}, {"gqa": 10.0}), "l2_gbps_per_sm=nan"),
    ((50.0, {"gqa": 0.0}, {"gqa": 10.0}), "efficiency['gqa']=0.0: must be a finite number > 0"),
    ((50.0, {"gqa": 0.8}, {"gqa": -1.0}), "launch_us['gqa']=-1.0: must be a finite number >= 0"),
    ((50.0, {"gqa": 0.8}, {}), "efficiency, launch_us: fitted for ['gqa'] and []"),
    ((50.0, {"flash": 0.8}, {"flash": 1.0}), "efficiency={'flash': 0.8}: must be a dict keyed"),
    ((50.0, [0.8], {"gqa": 1.0}), "efficiency=[0.8]: must be a dict keyed"),
])
def test_a_time_model_of_bad_constants_is_refused(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TimeModel(*args)


@pytest.mark.parametrize(("fit", "message"), [
    ({}, "fit={}: must be a dict with l2_gbps_per_sm"),
    ({"l2_gbps_per_sm": 50.0, "gqa": {"efficiency": 1.0}}, "fit['gqa']={'efficiency': 1.0}"),
    ({"l2_gbps_per_sm": 50.0, "gqa": {"efficiency": math.inf, "launch_us": 1.0}},
     "efficiency['gqa']=inf"),
])
def test_a_fit_of_another_shape_is_refused(fit, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TimeModel.from_fit(fit)


@pytest.mark.parametrize(("num_sms", "measured", "message"), [
    (math.nan, MEASURED, "num_sms=nan: must be an integer >= 1"),
    (56.5, MEASURED, "num_sms=56.5: must be an integer >= 1"),
    (True, MEASURED, "num_sms=True: must be an integer >= 1"),
    (-3, MEASURED, "num_sms=-3: must be an integer >= 1"),
    (8, {0: 100.0, 132: 4300.0}, "measured's SM count=0: must be an integer >= 1"),
    (8, {32: math.nan}, "measured[32]=nan: must be a finite number > 0"),
    (8, {32: -5.0}, "measured[32]=-5.0: must be a finite number > 0"),
    (8, [(32, 2000.0)], "measured=[(32, 2000.0)]: needs at least one measured SM count"),
])
def test_copy_roofline_refuses_what_it_cannot_interpolate(num_sms, measured, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        copy_roofline_gbps(num_sms, measured)


def test_copy_roofline_takes_numpy_counts():
    assert copy_roofline_gbps(np.int64(82), MEASURED) == pytest.approx(3150.0)


# -- the plan ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["vllm_v1", "gqa"])
@pytest.mark.parametrize(("args", "message"), [
    ((0, 1024, 132), "batch=0: must be an integer >= 1"),
    ((1, 0, 132), "context=0: must be an integer >= 1"),
    ((1, 1024, 0), "num_sms=0: must be an integer >= 1"),
    ((1.5, 1024, 132), "batch=1.5: must be an integer >= 1"),
    ((True, 1024, 132), "batch=True: must be an integer >= 1"),
    ((1, math.nan, 132), "context=nan: must be an integer >= 1"),
])
def test_launch_spec_refuses_bad_shapes(kernel, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        launch_spec("llama3-8b", kernel, *args, NONE)


@pytest.mark.parametrize("kernel", ["vllm_v1", "gqa"])
def test_launch_spec_refuses_a_huge_launch_before_planning_it(kernel):
    with no_hang(), pytest.raises(ValueError, match="MAX_TRACE_BYTES"):
        launch_spec("llama3-8b", kernel, 1000, 16_000_000, 132, NONE)
    with no_hang(), pytest.raises(ValueError, match="MAX_TRACE_BYTES"):
        launch_spec("llama3-8b", kernel, 1, 2**62, 132, NONE)


@pytest.mark.parametrize(("args", "fields", "message"), [
    ((["llama3-8b"], "gqa"), {}, "model=['llama3-8b']: must be one of"),
    (("llama3-8b", {"gqa"}), {}, "kernel={'gqa'}: must be one of"),
    (("llama3-8b", "gqa"), {"num_seqs": 4}, "fields: num_seqs: launch_spec plans these"),
    (("llama3-8b", "gqa"), {"colour": 4}, "fields: colour: launch_spec plans these"),
    (("llama3-8b", "gqa"), {"seed": -1}, "seed=-1: must be an integer >= 0"),
])
def test_launch_spec_refuses_bad_names_and_fields(args, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        launch_spec(*args, 1, 1024, 132, NONE, **fields)


def test_launch_spec_takes_numpy_shapes_and_the_other_fields():
    spec = launch_spec("llama3-8b", "gqa", np.int64(4), np.int32(1024), np.int64(132), NONE,
                       block_size=32, placement="contiguous", seed=3, jitter_rounds=0.5)
    assert spec == launch_spec("llama3-8b", "gqa", 4, 1024, 132, NONE, block_size=32,
                               placement="contiguous", seed=3, jitter_rounds=0.5)
    assert (spec.block_size, spec.seed, type(spec.num_seqs)) == (32, 3, int)
