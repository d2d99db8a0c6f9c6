"""KernelSpec: one launch of a kvlab decode kernel, as plain values that travel as JSON.

The spec names what `kvlab.profile.launch` builds in the profiled process: a cache of `batch`
sequences of `context` tokens (random K/V, scattered blocks), the plan of `kernel` with the
prefetch setting of `prefetch` (a `PrefetchConfig.label()`), and, with `num_sms`, a CUDA green
context of that many SMs around the launches.
"""

import json
from dataclasses import asdict, dataclass

from kvlab.checks import (
    check_block_size,
    check_head_dim,
    check_num_heads,
    check_positive_int,
    is_int,
)
from kvlab.config import MODELS
from kvlab.kernels import FAMILIES, KERNEL_FAMILIES
from kvlab.kernels.geometry import check_launch
from kvlab.kernels.prefetch import PrefetchConfig

DTYPES = ("float16", "bfloat16")
DTYPE_BYTES = 2  # both DTYPES


@dataclass(frozen=True)
class KernelSpec:
    """One decode-kernel launch to profile. Validated on construction (ValueError naming the
    field, its value and what is allowed); ints are stored as Python ints.

    kernel: a family of `kvlab.kernels.FAMILIES` ("vllm_v1" reads the "vllm" layout, "gqa" the
        "hnd" layout); "auto" is refused: a profile names the kernel it measured.
    prefetch: a PrefetchConfig label: "none", "bulk K+V d=1", "line K d=4 evict_last", ...
    num_qo_heads, num_kv_heads, head_dim: the attention layer's shape.
    batch, context: sequences, and tokens of K/V each (`kvlab.kernels.geometry.check_launch`:
        what one launch of `kernel` decodes).
    block_size: tokens per cache block (vllm_v1: 8, 16, 32; gqa: 8 to 256).
    dtype: "float16" or "bfloat16".
    num_sms: launch on a CUDA green context of this many SMs (`kvlab.kernels.green.sm_limit`);
        None: the whole GPU. Its upper bound (the GPU's SMs) is checked on the GPU.
    """

    kernel: str
    prefetch: str
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    batch: int
    context: int
    block_size: int = 16
    dtype: str = "float16"
    num_sms: int | None = None

    def __post_init__(self):
        if self.kernel not in FAMILIES:
            raise ValueError(f"kernel={self.kernel!r}: must be one of {FAMILIES}")
        try:
            PrefetchConfig.from_label(self.prefetch)
        except ValueError:
            raise ValueError(f"prefetch={self.prefetch!r}: must be a PrefetchConfig label like "
                             "'none', 'bulk K+V d=1' or 'line K d=4 evict_last'") from None
        check_num_heads(self.num_qo_heads, self.num_kv_heads)
        check_head_dim(self.head_dim)
        check_positive_int("batch", self.batch)
        check_positive_int("context", self.context)
        check_block_size(self.block_size)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: must be one of {DTYPES}")
        if self.num_sms is not None and (not is_int(self.num_sms) or self.num_sms < 1):
            raise ValueError(f"num_sms={self.num_sms!r}: must be an integer >= 1 or None")
        self._check_family()
        for name in ("num_qo_heads", "num_kv_heads", "head_dim", "batch", "context", "block_size",
                     "num_sms"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else int(value))

    def _check_family(self) -> None:
        KERNEL_FAMILIES[self.kernel].check_shape(self.block_size, self.num_qo_heads,
                                                 self.num_kv_heads)
        try:
            check_launch(self.kernel, self.batch, self.context)
        except ValueError as err:
            raise ValueError(f"batch={self.batch}, context={self.context}: {err}") from None

    @classmethod
    def for_model(cls, name: str, kernel: str, prefetch: str = "none", **shape) -> "KernelSpec":
        """The spec of one layer of the preset `name` (`kvlab.config.MODELS`); `shape` gives
        batch and context (and optionally block_size, dtype, num_sms)."""
        if name not in MODELS:
            raise ValueError(f"name={name!r}: must be one of {sorted(MODELS)}")
        model = MODELS[name]
        return cls(kernel, prefetch, model.num_qo_heads, model.num_kv_heads, model.head_dim,
                   **shape)

    def prefetch_config(self) -> PrefetchConfig:
        return PrefetchConfig.from_label(self.prefetch)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the launch reads (each once)."""
        return 2 * self.batch * self.context * self.num_kv_heads * self.head_dim * DTYPE_BYTES

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KernelSpec":
        """The spec `to_json` wrote (ValueError for anything else)."""
        try:
            fields = json.loads(text)
        except ValueError as err:
            raise ValueError(f"spec {text!r}: not JSON ({err})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"spec {text!r}: must be a JSON object of KernelSpec fields")
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"spec {text!r}: {err}") from None
