"""kvlab: a lab for the memory side of LLM decoding (paged KV cache, decode kernels, KV offload).

`import kvlab` is cheap: it loads no torch, plotly or widgets. Heavier parts load on first use.
"""

import importlib

from kvlab.config import MODELS, ModelConfig
from kvlab.device import backend, device_label

__version__ = "0.1.0"

_LAZY = {
    "PagedKVCache": ("kvlab.cache", "PagedKVCache"),
    "BlockPool": ("kvlab.cache", "BlockPool"),
    "OutOfBlocksError": ("kvlab.cache", "OutOfBlocksError"),
    "dashboard": ("kvlab.panels", "dashboard"),
    "decode_attention": ("kvlab.kernels.decode", "decode_attention"),
    "DecodePlan": ("kvlab.kernels.decode", "DecodePlan"),
    "PrefetchConfig": ("kvlab.kernels.prefetch", "PrefetchConfig"),
    "LLM": ("kvlab.engine", "LLM"),
}
_SUBMODULES = ("cache", "reference", "workload", "kernels", "model", "offload", "engine",
               "results", "panels", "viz", "bench")

__all__ = ["MODELS", "ModelConfig", "backend", "device_label", *_LAZY, *_SUBMODULES]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"kvlab.{name}")
    else:
        raise AttributeError(f"module 'kvlab' has no attribute {name!r}")
    globals()[name] = value
    return value
