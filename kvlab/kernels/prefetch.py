"""PrefetchConfig: the L2 prefetch options of the decode kernels (arXiv 2504.06319, Algorithm 1)."""

import contextlib
from dataclasses import dataclass

import numpy as np

from kvlab.checks import check_int

MODES = ("none", "bulk", "line")
MAX_DISTANCE = 16
_MODE_IDS = {"none": "kvlab::PF_NONE", "bulk": "kvlab::PF_BULK", "line": "kvlab::PF_LINE"}


@dataclass(frozen=True)
class PrefetchConfig:
    """Which KV tiles a decode kernel prefetches into L2, and how far ahead.

    mode: "none"; "bulk" (one `cp.async.bulk.prefetch.L2` per contiguous (block, KV head) tile);
        or "line" (one `prefetch.global.L2` per 128-byte line).
    k, v: prefetch K tiles, V tiles.
    distance: how many loop iterations ahead (for `vllm_v1`, warp strides: the paper uses 1).
    evict_last: tag prefetched lines evict-last in L2.
    """

    mode: str = "none"
    k: bool = True
    v: bool = True
    distance: int = 1
    evict_last: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: must be one of {MODES}")
        for name in ("k", "v", "evict_last"):
            value = getattr(self, name)
            if not isinstance(value, bool | np.bool_):
                raise ValueError(f"{name}={value!r}: must be a bool")
            object.__setattr__(self, name, bool(value))
        check_int("distance", self.distance, 1, MAX_DISTANCE)
        object.__setattr__(self, "distance", int(self.distance))

    @property
    def enabled(self) -> bool:
        return self.mode != "none" and (self.k or self.v)

    def template_args(self) -> str:
        """`PF_MODE, PF_K, PF_V, PF_DIST, PF_EVICT_LAST` for the kernels' C++ templates. Every
        disabled config maps to one instantiation."""
        if not self.enabled:
            return "kvlab::PF_NONE, false, false, 1, false"
        flags = ", ".join(str(x).lower() for x in (self.k, self.v))
        return f"{_MODE_IDS[self.mode]}, {flags}, {self.distance}, {str(self.evict_last).lower()}"

    @classmethod
    def from_label(cls, label: str) -> "PrefetchConfig":
        """The config whose `label()` is exactly `label` (as recorded in benchmark results):
        "none", or "<mode> <K, V or K+V> d=<distance>" with " evict_last" when set. Raises
        ValueError for any other string."""
        words = label.split() if isinstance(label, str) else []
        config = cls() if words == ["none"] else None
        if len(words) >= 3:
            mode, kv, distance, *rest = words
            with contextlib.suppress(ValueError):
                config = cls(mode, k="K" in kv.split("+"), v="V" in kv.split("+"),
                             distance=int(distance.removeprefix("d=")),
                             evict_last=rest == ["evict_last"])
        if config is None or config.label() != label:  # refuses what the parse let through
            raise ValueError(f"label={label!r}: not a PrefetchConfig label like 'none', "
                             f"'bulk K+V d=1' or 'line K d=4 evict_last'")
        return config

    def label(self) -> str:
        if not self.enabled:
            return "none"
        kv = "K+V" if self.k and self.v else ("K" if self.k else "V")
        return f"{self.mode} {kv} d={self.distance}" + (" evict_last" if self.evict_last else "")
