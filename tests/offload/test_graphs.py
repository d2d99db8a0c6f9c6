"""StaticLayers on the CPU run eagerly what a GPU captures as CUDA graphs: their fixed buffers must
give decode_layer's results for every (weights, GPU batch, KV slot), and keep each slot's new X
until that slot's next layer."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.layer import decode_layer
from kvlab.model.rope import RopeTable
from kvlab.model.weights import random_layers
from kvlab.offload.graphs import StaticLayers

BATCH, CONTEXT = 3, 11


def cache(model, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (CONTEXT + 2, BATCH, model.num_kv_heads, model.head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
def test_static_layers_equal_decode_layer(name):
    model = MODELS[name]
    weights = random_layers(model, seed=2, num_layers=2)
    rope = RopeTable.build(model, CONTEXT + 2, torch.float32, "cpu") \
        if model.position == "rope" else None
    hidden = torch.randn(2, BATCH, model.hidden_size, generator=torch.Generator().manual_seed(3))
    slots = [cache(model, seed) for seed in (4, 5)]
    static = StaticLayers(model, weights, hidden.clone(), [k for k, _ in slots],
                          [v for _, v in slots], rope, capture=False)
    static.set_position(CONTEXT)
    expected_hidden = hidden.clone()
    kept = []
    for w, g, slot in [(0, 1, 0), (1, 0, 1), (1, 1, 0)]:
        k, v = (t.clone() for t in slots[slot])
        expected_hidden[g], x = decode_layer(model, weights[w], expected_hidden[g], CONTEXT,
                                             k, v, rope)
        kept.append((x, static.run(w, g, slot).clone(), slot))
        torch.testing.assert_close(static.hidden, expected_hidden)
        torch.testing.assert_close(static.k_slots[slot][:CONTEXT + 1], k[:CONTEXT + 1])
        torch.testing.assert_close(static.v_slots[slot][:CONTEXT + 1], v[:CONTEXT + 1])
        slots[slot] = (k, v)
    for x, got, _ in kept:
        torch.testing.assert_close(got, x)
    assert not torch.equal(static.x_new[0], kept[0][1])  # slot 0's next layer replaced it
    torch.testing.assert_close(static.x_new[1], kept[1][1])


def test_capture_needs_a_gpu():
    model = MODELS["tiny-opt"]
    k, v = cache(model, 0)
    with pytest.raises(ValueError, match="capture=True with buffers on cpu: CUDA graphs need"):
        StaticLayers(model, random_layers(model, num_layers=1),
                     torch.zeros(1, BATCH, model.hidden_size), [k], [v], None, capture=True)
