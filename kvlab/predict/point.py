"""LaunchPoint: one decode launch the model is asked about, checked and resolved from plain values
(`launch_point`) before any work: the head layout, the batch's lengths, the kernel family and
its plan's inputs, the dtype, the SMs and the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvlab.checks import check_head_dim, check_int, check_num_heads, is_int
from kvlab.config import MODELS, ModelConfig
from kvlab.gpus import GPU, gpu
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES
from kvlab.kernels.geometry import (
    MAX_GRID_YZ,
    MAX_SEQ_LEN,
    PARTITION_SIZE,
)
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.workload import PRODUCTION_MIN_MAX, mixed_lengths, mixed_spec

# the KV cache's element types each family reads, and their bytes
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "fp8": 1}
Q_BYTES = 2  # q and out are fp16 or bf16, over an fp8 cache too
# the predictor takes the groups gqa takes, for either family (its fits are of those shapes)
MAX_GROUP = KERNEL_FAMILIES["gqa"].max_group
LONGEST = {"vllm_v1": MAX_GRID_YZ * PARTITION_SIZE, "gqa": MAX_SEQ_LEN}  # tokens a sequence


@dataclass(frozen=True, eq=False)
class LaunchPoint:
    """One decode launch of one layer. `model`: the preset's name, or None for a shape given by
    its heads. `context`: every sequence's tokens, or the longest's where `seq_lens` (int64
    [batch], read-only) holds mixed lengths drawn from `lengths` (kvlab.workload.mixed_spec)."""

    model: str | None
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    batch: int
    context: int
    lengths: str
    seq_lens: np.ndarray | None
    block_size: int
    family: str
    prefetch: PrefetchConfig
    dtype: str
    num_sms: int
    gpu: GPU

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the launch reads once: every token of every KV head."""
        tokens = self.batch * self.context if self.seq_lens is None else int(self.seq_lens.sum())
        return tokens * self.num_kv_heads * 2 * self.head_dim * DTYPE_BYTES[self.dtype]

    def lens(self) -> np.ndarray:
        """int64 [batch]: every sequence's tokens."""
        if self.seq_lens is None:
            return np.full(self.batch, self.context, dtype=np.int64)
        return self.seq_lens


def _compute_capability(g: GPU) -> int:
    """90 for "sm_90" (and "sm_90a"), 100 for "sm_100"."""
    return int("".join(c for c in g.arch[3:] if c.isdigit()))


def _choice(name: str, value, allowed, what: str = "") -> None:
    if not (isinstance(value, str) or is_int(value)) or value not in allowed:
        raise ValueError(f"{name}={value!r}: must be one of {tuple(allowed)}{what}")


def _heads(model_or_shape) -> tuple[str | None, int, int, int]:
    """(model name or None, num_qo_heads, num_kv_heads, head_dim) of a preset's name, a
    ModelConfig, or a (num_qo_heads, num_kv_heads, head_dim) triple."""
    if isinstance(model_or_shape, ModelConfig):
        m = model_or_shape
        return (m.name if MODELS.get(m.name) == m else None, m.num_qo_heads, m.num_kv_heads,
                m.head_dim)
    if isinstance(model_or_shape, str):
        if model_or_shape not in MODELS:
            raise ValueError(f"model_or_shape={model_or_shape!r}: must be one of "
                             f"{tuple(MODELS)}, or (num_qo_heads, num_kv_heads, head_dim)")
        m = MODELS[model_or_shape]
        return m.name, m.num_qo_heads, m.num_kv_heads, m.head_dim
    if not isinstance(model_or_shape, tuple | list) or len(model_or_shape) != 3:
        raise ValueError(f"model_or_shape={model_or_shape!r}: must be a model name of "
                         f"{tuple(MODELS)} or (num_qo_heads, num_kv_heads, head_dim)")
    num_qo_heads, num_kv_heads, head_dim = model_or_shape
    check_num_heads(num_qo_heads, num_kv_heads)
    check_head_dim(head_dim)
    return None, int(num_qo_heads), int(num_kv_heads), int(head_dim)


def launch_point(model_or_shape, batch: int, context: int | None, *, block_size: int = 16,
                 family: str = "gqa", prefetch=None, dtype: str = "float16",
                 lengths: str = "equal", num_sms: int | None = None,
                 gpu_key="h200") -> LaunchPoint:
    """The LaunchPoint of these plain values (see kvlab.predict.decode_launch), every one checked
    first: ValueError naming the parameter, its value and what is allowed, for a shape no
    kernel runs (query heads not a multiple of the KV heads, more than MAX_GROUP a KV head,
    a head_dim not in kvlab.checks.HEAD_DIMS), a batch or context out of the kernels' range, a
    block size or dtype the family does not take, a GPU not in kvlab.gpus, a bulk prefetch on a
    GPU before sm_90, an fp8 cache on one before sm_89, SMs past the GPU's, and K and V of one
    layer past the GPU's memory."""
    _choice("family", family, FAMILIES)
    model, num_qo_heads, num_kv_heads, head_dim = _heads(model_or_shape)
    if num_qo_heads > MAX_GROUP * num_kv_heads:
        raise ValueError(f"num_qo_heads={num_qo_heads}, num_kv_heads={num_kv_heads}: the kernels "
                         f"take 1 to {MAX_GROUP} query heads a KV head")
    check_int("batch", batch, 1, MAX_GRID_YZ)
    _choice("block_size", block_size, KERNEL_FAMILIES[family].block_sizes,
            f" for family={family!r}")
    _choice("dtype", dtype, KERNEL_FAMILIES[family].cache_dtypes, f" for family={family!r}")
    if prefetch is None or isinstance(prefetch, str):
        prefetch = PrefetchConfig.from_label(prefetch or "none")
    elif not isinstance(prefetch, PrefetchConfig):
        raise ValueError(f"prefetch={prefetch!r}: must be None, a PrefetchConfig or its label "
                         "('none', 'bulk K+V d=1', ...)")
    g = gpu(gpu_key)
    if prefetch.mode == "bulk" and prefetch.enabled and _compute_capability(g) < 90:
        raise ValueError(f"prefetch={prefetch.label()!r}: cp.async.bulk.prefetch.L2 needs sm_90 "
                         f"or later; gpu={g.key!r} is {g.arch}")
    if dtype == "fp8" and _compute_capability(g) < 89:
        raise ValueError(f"dtype='fp8': gqa widens e4m3 with cvt.rn.f16x2.e4m3x2, which needs "
                         f"sm_89 or later; gpu={g.key!r} is {g.arch}")
    num_sms = g.num_sms if num_sms is None else num_sms
    check_int("num_sms", num_sms, 1, g.num_sms)
    if isinstance(lengths, str) and lengths == "equal":
        check_int("context", context, 1, LONGEST[family])
        seq_lens, asked = None, f"context={context}"
    else:
        try:
            max_len = mixed_spec(lengths)[1][-1]
        except ValueError:
            raise ValueError(f"lengths={lengths!r}: must be 'equal' or a batch of mixed lengths, "
                             "'lognormal:MEAN,MAX' (integers 1 <= MEAN <= MAX) or "
                             f"'production:MAX' (an integer >= {PRODUCTION_MIN_MAX})") from None
        if context is not None:
            raise ValueError(f"context={context!r}: must be None with lengths={lengths!r} (the "
                             "spec draws the lengths)")
        check_int("lengths' MAX", max_len, 1, LONGEST[family])
        # drawn as `bench attention --lengths` draws them (seed 0)
        seq_lens = mixed_lengths(batch, lengths)
        seq_lens.setflags(write=False)
        context, asked = int(seq_lens.max()), f"lengths={lengths!r}"
    point = LaunchPoint(model, num_qo_heads, num_kv_heads, head_dim, int(batch), int(context),
                        lengths, seq_lens, int(block_size), family, prefetch, dtype,
                        int(num_sms), g)
    if point.kv_bytes > g.memory_bytes:
        raise ValueError(f"batch={batch}, {asked}: K and V of one layer take "
                         f"{point.kv_bytes / 1e9:,.1f} GB, past the {g.name}'s "
                         f"{g.memory_bytes / 1e9:,.0f} GB")
    return point
