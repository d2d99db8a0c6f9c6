"""The figures' numbers at their extremes: zero, negative, NaN, infinite, huge, bools and
numpy scalars. Each bad one is a ValueError naming the parameter; numpy scalars are taken (CPU)."""

import math
import re

import numpy as np
import pytest

from kvlab.config import MODELS
from kvlab.offload.scheduler import LinkAndCompute, unit_shape
from kvlab.sim.l2 import L2Result
from kvlab.viz.cache import block_table_figure
from kvlab.viz.counters import modelled_l2_figure
from kvlab.viz.e2e import steps_figure, tensor_parallel_figure
from kvlab.viz.kernels import bandwidth_figure
from kvlab.viz.layout import note_figure
from kvlab.viz.offload import split_figure

NOT_INTS = [0, -1, math.nan, math.inf, True, 1.5, np.float64(16.0)]
ROWS = [{"model": "m", "batch": 1, "context": 64, "kernel": k, "prefetch": "none",
         "block_size": 16, "gbps": g, "ms": 0.01} for k, g in (("gqa", 3000.0), ("read", 3500.0))]
SHAPE = unit_shape(MODELS["opt-6.7b"], 16, 1024)
RATES = LinkAndCompute(50e9, 500e12, "what-if rates")
E2E_ROWS = [{"model": "m", "batch": 64, "variant": "gqa", "tp": tp, "tokens_per_s": 1e3 * tp,
             "step_ms": 10.0 / tp} for tp in (1, 2)]


def refused(name, value, allowed):
    return pytest.raises(ValueError, match=re.escape(f"{name}={value!r}: {allowed}"))


@pytest.mark.parametrize("roofline", [0, -1.0, math.nan, math.inf, True])
def test_bandwidth_needs_a_positive_finite_roofline(roofline):
    with refused("roofline_gbps", roofline, "must be a finite number > 0"):
        bandwidth_figure(ROWS, roofline, "p")


def test_bandwidth_takes_a_numpy_roofline():
    fig = bandwidth_figure(ROWS, np.float32(4000.0), "p")
    assert list(fig.data[0].text) == ["75%", "88%"]


FIGURES = {
    "note": lambda height: note_figure("t", "p", "n", height),
    "bandwidth": lambda height: bandwidth_figure(ROWS, 4000.0, "p", height=height),
    "block_table": lambda height: block_table_figure([[0, 1]], [20], 16, height=height),
    "split": lambda height: split_figure(SHAPE, RATES, height=height),
    "steps": lambda height: steps_figure({"a": [1.0, 2.0]}, "t", "p", height=height),
}


@pytest.mark.parametrize("figure", FIGURES)
@pytest.mark.parametrize("height", [0, 9, -420, math.nan, math.inf, 2**70, True, 420.5, "420"])
def test_a_height_is_an_integer_of_pixels_in_range(figure, height):
    with refused("height", height, "must be an integer in [10, 100000]"):
        FIGURES[figure](height)


@pytest.mark.parametrize("figure", FIGURES)
def test_a_numpy_height_is_taken(figure):
    assert FIGURES[figure](np.int64(900)).layout.height == 900


@pytest.mark.parametrize("block_size", [*NOT_INTS, 3, 512, 2**70])
def test_block_table_needs_a_block_size_of_the_cache(block_size):
    with refused("block_size", block_size, "must be a power of two in [1, 256]"):
        block_table_figure([[0, 1]], [20], block_size)


@pytest.mark.parametrize("max_blocks", NOT_INTS)
def test_block_table_needs_a_positive_max_blocks(max_blocks):
    with refused("max_blocks", max_blocks, "must be an integer >= 1"):
        block_table_figure([[0, 1]], [20], 16, max_blocks=max_blocks)


def test_block_table_takes_numpy_integers_and_draws_huge_max_blocks_whole():
    fig = block_table_figure([[0, 1, 2]], [40], np.int64(16), max_blocks=2**70)
    assert fig.data[0].z.shape == (1, 3)


@pytest.mark.parametrize("selected_l", [-1, 1025, math.nan, 2**70, True, 1.5])
def test_split_figure_draws_a_split_of_the_context_only(selected_l):
    with refused("selected_l", selected_l, "must be an integer in [0, 1024]"):
        split_figure(SHAPE, RATES, selected_l)


@pytest.mark.parametrize("gpu_batches", NOT_INTS)
def test_split_figure_needs_a_positive_number_of_gpu_batches(gpu_batches):
    with refused("gpu_batches", gpu_batches, "must be an integer >= 1"):
        split_figure(SHAPE, RATES, 0, gpu_batches=gpu_batches)


def test_split_figure_takes_numpy_integers():
    fig = split_figure(SHAPE, RATES, np.int64(1024), gpu_batches=np.int32(1))
    assert any(t.name == "chosen l=1024" for t in fig.data)


@pytest.mark.parametrize("step_ms,name", [({}, "step_ms"), ([1.0], "step_ms"),
                                          ({"a": []}, "step_ms['a']"),
                                          ({"a": [1.0, math.nan]}, "step_ms['a']"),
                                          ({"a": [1.0], "b": [math.inf]}, "step_ms['b']"),
                                          ({"a": [1.0, -2.0]}, "step_ms['a']"),
                                          ({"a": [True]}, "step_ms['a']")])
def test_steps_figure_needs_runs_of_finite_times(step_ms, name):
    with pytest.raises(ValueError, match=re.escape(f"{name}=")):
        steps_figure(step_ms, "t", "p")


def test_steps_figure_takes_numpy_times():
    fig = steps_figure({"a": list(np.array([1.0, 3.0]))}, "t", "p")
    assert fig.layout.yaxis.range == (0, 4.0)


RESULTS = {"none": L2Result(demand_misses=1000), "bulk K+V d=1": L2Result(demand_hits=900,
                                                                           demand_misses=100)}


@pytest.mark.parametrize("roofline", [0, -1.0, math.nan, math.inf, True])
def test_modelled_l2_needs_a_positive_finite_roofline(roofline):
    with refused("roofline_gbps", roofline, "must be a finite number > 0"):
        modelled_l2_figure(RESULTS, "s", "p", times_ms={"none": 1.0, "bulk K+V d=1": 1.0},
                           roofline_gbps=roofline)


@pytest.mark.parametrize("times_ms,name,value", [
    ({"none": 0.0, "bulk K+V d=1": 1.0}, "none", 0.0),
    ({"none": 1.0, "bulk K+V d=1": math.nan}, "bulk K+V d=1", math.nan),
    ({"none": -1.0, "bulk K+V d=1": 1.0}, "none", -1.0)])
def test_modelled_l2_needs_a_positive_time_for_each_setting(times_ms, name, value):
    with refused(f"times_ms[{name!r}]", value, "must be a finite number > 0"):
        modelled_l2_figure(RESULTS, "s", "p", times_ms=times_ms, roofline_gbps=3000.0)
    with pytest.raises(ValueError, match=re.escape("has no time of ['bulk K+V d=1']")):
        modelled_l2_figure(RESULTS, "s", "p", times_ms={"none": 1.0}, roofline_gbps=3000.0)


def test_modelled_l2_needs_a_setting():
    with pytest.raises(ValueError, match=re.escape("results={}: must hold at least one")):
        modelled_l2_figure({}, "s", "p")


def test_modelled_l2_takes_numpy_numbers():
    fig = modelled_l2_figure(RESULTS, "s", "p", times_ms={"none": np.float64(2.0),
                                                          "bulk K+V d=1": np.float32(1.0)},
                             roofline_gbps=np.float64(3000.0))
    assert len(fig.data) == 4


@pytest.mark.parametrize("batch", NOT_INTS)
def test_tensor_parallel_needs_a_positive_batch(batch):
    with refused("batch", batch, "must be an integer >= 1"):
        tensor_parallel_figure(E2E_ROWS, "m", batch, "p")


def test_tensor_parallel_takes_a_numpy_batch():
    assert list(tensor_parallel_figure(E2E_ROWS, "m", np.int64(64), "p").data[0].x) == [1, 2]


@pytest.mark.parametrize("anatomy", [{}, {"kernels": []}, None, {"kernels": [1], "step_us": 1},
                                     {"kernels": [{}], "step_us": 0}])
def test_the_step_anatomy_needs_its_kernels_and_a_step(anatomy):
    from kvlab.viz.e2e import anatomy_figure

    with pytest.raises(ValueError, match="anatomy: must hold kernels and a step_us > 0"):
        anatomy_figure(anatomy, "t", "p")


@pytest.mark.parametrize("name", ["recorded_ms", "learned_ms"])
@pytest.mark.parametrize("value", [-5.0, float("nan"), 0, "1"])
def test_the_step_anatomy_refuses_a_bad_recorded_or_learned_step(name, value):
    from kvlab.predict.step import StepModel, step_anatomy
    from kvlab.viz.e2e import anatomy_figure

    anatomy = step_anatomy("llama3-8b", 1, 640, 4000.0, StepModel(2.0, 3.0, 0.2, 0, 0.0, 0.0))
    with pytest.raises(ValueError, match=rf"{name}=.*: must be a finite number > 0"):
        anatomy_figure(anatomy, "t", "p", **{name: value})
