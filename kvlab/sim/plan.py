"""The TraceSpec of one decode launch as kvlab's kernels plan it (`launch_spec`): vllm_v1's v1 / v2
choice and gqa's partition size and warps on the SMs given, and the CTAs an SM holds.

vllm_v1's CTAs an SM (kvlab.kernels.geometry) are what the driver reports for vllm_decode<__half,
128, 16, ...>, which a GPU test checks (tests/kernels/test_decode.py): registers limit v1 and v2
to VLLM_CTAS_PER_SM = 5, with or without prefetch, as vLLM's own build runs them. NOTE: older
recordings ran earlier builds of the kernel at other occupancies (ncu's
launch__occupancy_limit_registers = 4 in tests/profile/data/ncu_raw_h200.csv); the git history
of kernels/paged_decode_vllm.cu says which. gqa's follows from
its shared memory (kvlab.kernels.geometry.ctas_per_sm), which ncu confirms (its
launch__occupancy_limit_shared_mem = 2 for head_dim 128, as ctas_per_sm(128) says).
"""

from dataclasses import fields as dataclass_fields
from dataclasses import replace

from kvlab.checks import check_int
from kvlab.config import MODELS
from kvlab.kernels import FAMILIES
from kvlab.kernels.geometry import (
    VLLM_CTAS_PER_SM,
    ctas_per_sm,
    split_plan,
    use_partitions,
)
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim.spec import TraceSpec

# the TraceSpec fields launch_spec plans; `fields` may set the others
PLANNED = ("family", "num_seqs", "context", "num_qo_heads", "num_kv_heads", "head_dim",
           "partition_size", "ctas_per_sm", "prefetch", "num_sms", "warps")


def launch_spec(model: str, kernel: str, batch: int, context: int, num_sms: int,
                prefetch: PrefetchConfig, **fields) -> TraceSpec:
    """The TraceSpec of one decode launch of `kernel` for `model` (a kvlab.MODELS name) at batch
    x context on num_sms SMs with `prefetch`, planned as the kernels plan it; `fields` set the
    TraceSpec's other fields (block_size, placement, seed, jitter_rounds).
    Raises ValueError for an unknown model or kernel, batch, context or num_sms not an integer
    >= 1, a field it plans or that TraceSpec lacks, and for what TraceSpec refuses (a trace past
    its memory limit too), all before planning."""
    shape = launch_shape(model, kernel, batch, context, num_sms, prefetch, **fields)
    return replace(shape, **launch_plan(model, kernel, batch, context, num_sms))


def launch_shape(model: str, kernel: str, batch: int, context: int, num_sms: int,
                 prefetch: PrefetchConfig, **fields) -> TraceSpec:
    """The launch of `launch_spec` before planning: whole sequences, one CTA an SM (the fewest
    iterations a plan can give it). Raises ValueError as `launch_spec`."""
    if not isinstance(model, str) or model not in MODELS:
        raise ValueError(f"model={model!r}: must be one of {', '.join(MODELS)}")
    if not isinstance(kernel, str) or kernel not in FAMILIES:
        raise ValueError(f"kernel={kernel!r}: must be one of {', '.join(FAMILIES)}")
    for name, value in (("batch", batch), ("context", context), ("num_sms", num_sms)):
        check_int(name, value, 1)
    settable = [f.name for f in dataclass_fields(TraceSpec) if f.name not in PLANNED]
    if set(fields) - set(settable):
        raise ValueError(f"fields: {', '.join(sorted(set(fields) - set(settable)))}: "
                         f"launch_spec plans these or TraceSpec lacks them; it takes "
                         f"{', '.join(settable)}")
    m = MODELS[model]
    return TraceSpec(family=kernel, num_seqs=batch, context=context,
                     num_qo_heads=m.num_qo_heads, num_kv_heads=m.num_kv_heads,
                     head_dim=m.head_dim, partition_size=0, ctas_per_sm=1, prefetch=prefetch,
                     num_sms=num_sms, warps=4 if kernel == "vllm_v1" else 8, **fields)


def launch_plan(model: str, kernel: str, batch: int, context: int, num_sms: int) -> dict:
    """{"partition_size", "ctas_per_sm", "warps"}: how the kernels plan the launch of
    `launch_spec` (vllm_v1: vLLM's v1 / v2 rule; gqa: split_plan on num_sms SMs). The planner's
    work grows with context: check the shape first (`launch_shape`)."""
    m = MODELS[model]
    if kernel == "vllm_v1":
        part = 512 if use_partitions(batch, m.num_qo_heads, context) else 0
        return {"partition_size": part, "ctas_per_sm": VLLM_CTAS_PER_SM, "warps": 4}
    part, warps = split_plan(batch, m.num_kv_heads, context, num_sms, ctas_per_sm(m.head_dim),
                             2 * m.head_dim * 2,  # fp16 K and V
                             eight_warps=ctas_per_sm(m.head_dim, 2, 8) >= 1)
    return {"partition_size": 0 if part >= context else part,
            "ctas_per_sm": ctas_per_sm(m.head_dim, 2, warps), "warps": warps}
