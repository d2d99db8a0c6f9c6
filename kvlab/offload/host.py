"""The host side of KVPR: pinned memory at its exact size, and the store of every layer's K, V and
attention inputs, and its prefill.

torch's pinned allocator (`pin_memory=True`) rounds each allocation up to a power of two, so a
40 GiB store would hold 64 GiB of page-locked memory. `PinnedHostMemory` pins a plain allocation of
the size asked (plus under two pages of alignment) with cudaHostRegister instead, and a failure is
an error: a pageable fallback would silently make every copy synchronous and 3-7x slower.
"""

from __future__ import annotations

import weakref

import torch

from kvlab.arith import ceil_div
from kvlab.cache.paged_cache import check_fits
from kvlab.checks import check_int, check_positive_int, is_int
from kvlab.config import ModelConfig
from kvlab.model.attention import attention_input, project_kv
from kvlab.model.weights import LayerWeights, check_layers, seeded_randn
from kvlab.offload.scheduler import check_dtype_bytes

PAGE = 4096


def _cuda_check(err, what: str) -> None:
    code = int(err)
    if code != 0:
        message = torch.cuda.cudart().cudaGetErrorString(err)
        raise RuntimeError(f"{what}: CUDA error {code} ({message})")


class PinnedHostMemory:
    """`num_bytes` of page-locked host memory as a uint8 tensor (`.bytes`), unpinned when this
    object is collected. Views made from it stay valid memory after that, but are no longer
    pinned: keep this object alive while copies use them.

    NOTE: torch's `is_pinned()` says False for it (torch knows only its own pinned allocations);
    the driver treats it as pinned: non_blocking copies run asynchronously at the pinned rate.
    """

    def __init__(self, num_bytes: int):
        check_positive_int("num_bytes", num_bytes)
        if not torch.cuda.is_available():
            raise RuntimeError(f"num_bytes={num_bytes}: pinned host memory needs a CUDA device")
        try:
            raw = torch.empty(num_bytes + 2 * PAGE, dtype=torch.uint8)
        except RuntimeError as err:
            raise RuntimeError(f"num_bytes={num_bytes}: host allocation failed ({err})") from err
        offset = -raw.data_ptr() % PAGE
        ptr, length = raw.data_ptr() + offset, ceil_div(num_bytes, PAGE) * PAGE
        cudart = torch.cuda.cudart()
        _cuda_check(cudart.cudaHostRegister(ptr, length, 0),
                    f"num_bytes={num_bytes}: pinning host memory failed (no pageable fallback)")
        self._raw, self.num_bytes, self.address = raw, num_bytes, ptr
        self.bytes = raw[offset:offset + num_bytes]
        self._unpin = weakref.finalize(self, cudart.cudaHostUnregister, ptr)


def store_bytes(model: ModelConfig, batch: int, max_context: int, dtype_bytes: int = 2) -> dict:
    """Host bytes of a KVPR store: K and V, and the attention inputs X, of every layer.
    ValueError unless batch and max_context are positive integers and dtype_bytes 1, 2 or 4."""
    check_positive_int("batch", batch)
    check_positive_int("max_context", max_context)
    check_dtype_bytes(dtype_bytes)
    tokens = batch * max_context * model.num_layers * dtype_bytes
    kv, x = 2 * tokens * model.kv_size, tokens * model.hidden_size
    return {"kv": kv, "activations": x, "total": kv + x}


class HostStore:
    """Every layer's K, V [max_context, batch, num_kv_heads, head_dim] and attention inputs X
    [max_context, batch, hidden], token-major: the tokens [a, b) of the whole batch are one
    contiguous block, so each range crosses PCIe as one copy. The batch's sequences share one
    length, `length`.

    pinned: page-locked memory (needs CUDA); False gives pageable memory, for CPU runs.
    budget_bytes: refuse, before allocating anything, a store larger than this (an integer
    >= 0, or None). A store larger than the host's available memory is refused in any case.
    """

    def __init__(self, model: ModelConfig, batch: int, max_context: int,
                 dtype=torch.float16, pinned: bool = True, budget_bytes: int | None = None):
        check_positive_int("batch", batch)
        check_positive_int("max_context", max_context)
        if budget_bytes is not None:
            check_int("budget_bytes", budget_bytes, 0)
        itemsize = torch.empty((), dtype=dtype).element_size()
        need = store_bytes(model, batch, max_context, itemsize)
        if budget_bytes is not None and need["total"] > budget_bytes:
            raise ValueError(
                f"budget_bytes={budget_bytes:,}: the store needs {need['total']:,} bytes "
                f"({need['kv']:,} of K, V and {need['activations']:,} of activations for "
                f"{model.num_layers} layers x {batch} sequences x {max_context} tokens)"
            )
        check_fits(f"batch={batch}, max_context={max_context}: the store's K, V and activations",
                   need["total"], torch.device("cpu"))
        self.model, self.dtype = model, dtype
        self.batch, self.max_context = int(batch), int(max_context)
        self._memory = PinnedHostMemory(need["total"]) if pinned else None
        flat = (
            self._memory.bytes.view(dtype) if pinned
            else torch.empty(need["total"] // itemsize, dtype=dtype)
        )
        kv_shape = (model.num_layers, max_context, batch, model.num_kv_heads, model.head_dim)
        x_shape = (model.num_layers, max_context, batch, model.hidden_size)
        n_kv = kv_shape[0] * kv_shape[1] * kv_shape[2] * model.kv_size
        self.k = flat[:n_kv].view(kv_shape)
        self.v = flat[n_kv:2 * n_kv].view(kv_shape)
        self.x = flat[2 * n_kv:].view(x_shape)
        self.length = 0

    @property
    def pinned(self) -> bool:
        return self._memory is not None


def fill(store: HostStore, layers: list[LayerWeights], context: int, seed: int = 0,
         device="cpu") -> None:
    """Prefill `store` with `context` tokens per sequence: for each layer, random layer inputs,
    their attention inputs X and the K, V computed from them at positions 0..context-1, from
    generators seeded seed + layer. `layers`: every layer of the store's model, in the store's
    dtype, on `device`. ValueError for those, a context not in [0, max_context] or a seed not in
    [0, 2**63 - 1], before anything is written."""
    if not is_int(context) or not 0 <= context <= store.max_context:
        raise ValueError(f"context={context!r}: must be in [0, max_context={store.max_context}] "
                         "(an integer)")
    check_int("seed", seed, 0, 2**63 - 1)
    check_layers(store.model, layers, store.dtype, device)
    context = int(context)
    model, batch = store.model, store.batch
    positions = torch.arange(context, device=device).repeat_interleave(batch)
    for i, w in enumerate(layers):
        hidden = seeded_randn(seed + i, store.dtype, device)(context * batch, model.hidden_size)
        x = attention_input(model, w.attn, hidden)
        k, v = project_kv(model, w.attn, x, positions)
        store.x[i, :context].copy_(x.view(context, batch, -1))
        store.k[i, :context].copy_(k.view(context, batch, *k.shape[1:]))
        store.v[i, :context].copy_(v.view(context, batch, *v.shape[1:]))
    store.length = context
