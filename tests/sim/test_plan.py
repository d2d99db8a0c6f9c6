"""kvlab.sim.plan: the modelled launch is planned as the kernels plan it (CPU)."""

import pytest

from kvlab.kernels.geometry import VLLM_CTAS_PER_SM
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim.plan import launch_spec

NONE = PrefetchConfig()


def test_the_modelled_launch_is_planned_as_the_kernels_plan_it():
    few = launch_spec("llama3-8b", "gqa", 1, 32768, 32, NONE)
    many = launch_spec("llama3-8b", "gqa", 64, 32768, 132, NONE)
    assert few.partition_size and few.num_sms == 32  # one sequence: split to fill the SMs
    assert launch_spec("llama2-7b", "vllm_v1", 1, 4096, 132, NONE).partition_size == 512
    assert launch_spec("llama2-7b", "vllm_v1", 64, 4096, 132, NONE).partition_size == 0
    assert many.ctas_per_sm == few.ctas_per_sm == 2  # shared memory (ncu: limit 2)
    vllm = launch_spec("qwen2.5-7b", "vllm_v1", 16, 4096, 80, PrefetchConfig("bulk"))  # v2
    assert (vllm.ctas_per_sm, vllm.num_qo_heads, vllm.num_kv_heads) == (VLLM_CTAS_PER_SM, 28, 4)
    v1 = [launch_spec("qwen2.5-7b", "vllm_v1", 64, 4096, 80, p).ctas_per_sm
          for p in (NONE, PrefetchConfig("line"))]
    assert v1 == [VLLM_CTAS_PER_SM, VLLM_CTAS_PER_SM]
    # registers hold v1 and v2 to 5, with or without prefetch, as vLLM's build (a GPU test
    # checks the driver's counts)
    assert VLLM_CTAS_PER_SM == 5
    assert launch_spec("llama2-7b", "gqa", 8, 512, 132, NONE, seed=3).seed == 3
    assert (many.warps, launch_spec("llama2-7b", "vllm_v1", 1, 4096, 132, NONE).warps) == (4, 4)
    # 64 lone CTAs cannot keep HBM busy: 8 warps, unsplit, one an SM (kvlab.kernels.geometry)
    eight = launch_spec("qwen2.5-7b", "gqa", 16, 1024, 132, NONE)
    assert (eight.warps, eight.partition_size, eight.ctas_per_sm) == (8, 0, 1)


@pytest.mark.parametrize(("args", "message"), [
    (("llama9", "gqa"), "model='llama9': must be one of"),
    (("llama2-7b", "flash"), "kernel='flash': must be one of vllm_v1, gqa"),
])
def test_unknown_names_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        launch_spec(*args, 1, 1024, 132, NONE)
