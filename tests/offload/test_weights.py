"""Offloaded weights: every layer packed in host memory, W_K and W_V first, unpacked as views."""

import re

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.weights import KV_FIELDS, LayerWeights, named_tensors, random_layers
from kvlab.offload.host import HostStore
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import layer_weight_bytes
from kvlab.offload.weights import ALIGN, HostLayers, Packing, with_tensors


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
def test_packing_puts_w_k_w_v_first_and_round_trips(name):
    layers = random_layers(MODELS[name], seed=2, num_layers=2)
    host = HostLayers(layers, pinned=False)
    packing = host.packing
    names = list(packing.offsets)
    kv = [n for n in KV_FIELDS if n in names]
    assert names[:len(kv)] == kv and {"attn.w_k", "attn.w_v"} <= set(kv)
    assert all(offset % ALIGN == 0 for offset, _ in packing.offsets.values())
    kv_end = max(packing.offsets[n][0] for n in kv)
    assert kv_end < packing.kv_bytes <= min(packing.offsets[n][0] for n in names[len(kv):])
    for block, w in zip(host.layer_bytes, layers, strict=True):
        unpacked = named_tensors(packing.views(block, host.template))
        original = named_tensors(w)
        assert unpacked.keys() == original.keys()
        for key, tensor in original.items():
            assert torch.equal(unpacked[key], tensor), key


def test_views_share_the_flat_buffer():
    w = LayerWeights.random(MODELS["tiny-llama"], seed=1)
    packing = Packing.of(w)
    flat = torch.zeros(packing.num_bytes, dtype=torch.uint8)
    views = packing.views(flat, w)
    views.attn.w_k.fill_(1.0)
    assert flat.view(torch.float32)[: views.attn.w_k.numel()].eq(1.0).all()
    assert views.w_gate.shape == w.w_gate.shape and views.attn.b_k is None


def test_layers_of_different_shapes_or_dtypes_are_refused():
    a = LayerWeights.random(MODELS["tiny-llama"], seed=1)
    b = LayerWeights.random(MODELS["tiny-opt"], seed=1)
    with pytest.raises(ValueError, match=r"layers\[1\] differs from layers\[0\]"):
        HostLayers([a, b], pinned=False)
    with pytest.raises(ValueError, match="layers is empty"):
        HostLayers([], pinned=False)
    with pytest.raises(ValueError, match="layer weights of dtypes"):
        Packing.of(with_tensors(a, {"w_up": a.w_up.half()}))


@pytest.mark.parametrize(
    ("packed_for", "count", "message"),
    [
        ("tiny-opt", 2, "layers[0].attn.w_k: shape (256, 256), must be (128, 256) for tiny-llama"),
        ("tiny-qwen", 2, "layers[0].attn.w_k: shape (128, 384), must be (128, 256) for tiny-llama"),
        ("tiny-llama", 1, "len(layers)=1: must be tiny-llama's 2"),
    ],
)
def test_layers_packed_for_another_model_are_refused(packed_for, count, message):
    host = HostLayers(random_layers(MODELS[packed_for], seed=2, num_layers=count), pinned=False)
    store = HostStore(MODELS["tiny-llama"], 2, 8, dtype=torch.float32, pinned=False)
    with pytest.raises(ValueError, match=re.escape(message)):
        KVPRDecoder(MODELS["tiny-llama"], host, store, "cpu")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_schedulers_weight_bytes_are_the_packings(name, dtype):
    """The scheduler (no torch) counts a layer's packed bytes as Packing lays them out."""
    layer = random_layers(MODELS[name], dtype=dtype, device="meta", num_layers=1)[0]
    packing = Packing.of(layer)
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert layer_weight_bytes(MODELS[name], itemsize) == (packing.kv_bytes, packing.num_bytes)
