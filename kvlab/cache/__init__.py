"""The paged KV cache: a block pool, block tables with prefix sharing and copy-on-write, and the
K/V tensors they index.

The pool, the block tables and the accounting are pure Python and numpy; only `PagedKVCache`
needs torch, so it loads on first use.
"""

from kvlab.cache.block_manager import Allocation, BlockManager
from kvlab.cache.block_pool import BlockPool, OutOfBlocksError

_TORCH_NAMES = {"LAYOUTS": "paged_cache", "PagedKVCache": "paged_cache",
                "cache_shapes": "paged_cache", "filled_cache": "filled"}

__all__ = ["Allocation", "BlockManager", "BlockPool", "OutOfBlocksError", *_TORCH_NAMES]


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        import importlib

        return getattr(importlib.import_module(f"kvlab.cache.{_TORCH_NAMES[name]}"), name)
    raise AttributeError(f"module 'kvlab.cache' has no attribute {name!r}")
