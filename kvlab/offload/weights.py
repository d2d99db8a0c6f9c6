"""A decoder's weights offloaded with its KV cache: every layer's tensors packed into one block of
pinned host memory, W_K and W_V (with their biases) first, so that the runtime can copy them ahead
of the rest and start recomputing K, V before the whole layer has arrived (KVPR's fine-grained
pipeline). A GPU slot holds one layer at a time, as views into one flat buffer.
"""

from __future__ import annotations

import dataclasses

import torch

from kvlab.arith import ceil_div
from kvlab.model.weights import KV_FIELDS, LayerWeights, named_tensors
from kvlab.offload.host import PinnedHostMemory
from kvlab.offload.scheduler import ALIGN


def with_tensors(w: LayerWeights, tensors: dict[str, torch.Tensor]) -> LayerWeights:
    """A copy of `w` whose fields named in `tensors` are replaced by them."""
    attn = {n.removeprefix("attn."): t for n, t in tensors.items() if n.startswith("attn.")}
    rest = {n: t for n, t in tensors.items() if not n.startswith("attn.")}
    return dataclasses.replace(w, attn=dataclasses.replace(w.attn, **attn), **rest)


@dataclasses.dataclass(frozen=True)
class Packing:
    """Where each tensor of a layer lies in its packed bytes: name -> (offset, shape)."""

    offsets: dict[str, tuple[int, tuple[int, ...]]]
    kv_bytes: int  # the bytes [0, kv_bytes) hold KV_FIELDS
    num_bytes: int
    dtype: torch.dtype

    @classmethod
    def of(cls, w: LayerWeights) -> Packing:
        offsets, end, kv_bytes = {}, 0, 0
        tensors = named_tensors(w)
        dtypes = {t.dtype for t in tensors.values()}
        if len(dtypes) != 1:
            raise ValueError(f"layer weights of dtypes {sorted(map(str, dtypes))}: must share one")
        for name, t in tensors.items():
            offsets[name] = (end, tuple(t.shape))
            end += ceil_div(t.numel() * t.element_size(), ALIGN) * ALIGN
            if name in KV_FIELDS:
                kv_bytes = end
        return cls(offsets, kv_bytes, end, dtypes.pop())

    def views(self, flat: torch.Tensor, template: LayerWeights) -> LayerWeights:
        """`template`'s structure over the bytes `flat` [num_bytes] uint8."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        tensors = {}
        for name, (offset, shape) in self.offsets.items():
            count = 1
            for n in shape:
                count *= n
            tensors[name] = flat[offset:offset + count * itemsize].view(self.dtype).view(shape)
        return with_tensors(template, tensors)


class HostLayers:
    """Every layer's weights in host memory, packed by `Packing`: `layer_bytes[i]` is layer i's
    [packing.num_bytes] uint8 block. The layers given may live on the GPU or the CPU; nothing
    here keeps a reference to them. pinned: page-locked at exact size (needs CUDA); False gives
    pageable memory, for CPU runs."""

    def __init__(self, layers: list[LayerWeights], pinned: bool = True):
        if not layers:
            raise ValueError("layers is empty: give every layer of the model")
        self.packing = Packing.of(layers[0])
        for i, w in enumerate(layers):
            if Packing.of(w) != self.packing:
                raise ValueError(f"layers[{i}] differs from layers[0] in shapes or dtype")
        n, total = self.packing.num_bytes, self.packing.num_bytes * len(layers)
        self._memory = PinnedHostMemory(total) if pinned else None
        flat = self._memory.bytes if pinned else torch.empty(total, dtype=torch.uint8)
        self.layer_bytes = [flat[i * n:(i + 1) * n] for i in range(len(layers))]
        for block, w in zip(self.layer_bytes, layers, strict=True):
            packed = named_tensors(self.packing.views(block, w))
            for name, t in named_tensors(w).items():
                packed[name].copy_(t)
        self.template = self.packing.views(self.layer_bytes[0], layers[0])  # structure only
        self.pinned = pinned

    def __len__(self) -> int:
        return len(self.layer_bytes)

    @property
    def num_bytes(self) -> int:
        return self.packing.num_bytes * len(self)
