"""kvlab.model.weights.fuse: stacked projections compute what the separate ones do."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.layer import layer_head, layer_tail
from kvlab.model.rope import RopeTable
from kvlab.model.weights import LayerWeights, fuse, named_tensors


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen", "tiny-opt"])
def test_a_fused_layer_computes_what_the_separate_projections_do(name):
    m = MODELS[name]
    separate = LayerWeights.random(m, seed=4)
    stacked = LayerWeights.random(m, seed=4)
    before = {n: t.clone() for n, t in named_tensors(stacked).items()}
    fused = fuse(stacked)
    for n, t in named_tensors(stacked).items():  # the same values, now views of the stacks
        assert torch.equal(t, before[n]), n
    assert stacked.attn.w_k.data_ptr() == fused.qkv.data_ptr() + m.q_size * m.hidden_size * 4
    assert (fused.gate_up is None) == (m.family == "opt")
    rope = RopeTable.build(m, 64, torch.float32, "cpu") if m.position == "rope" else None
    hidden = torch.randn(3, m.hidden_size, generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([0, 5, 63])
    want = layer_head(m, separate, hidden, positions, rope)
    got = layer_head(m, stacked, hidden, positions, rope, fused)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[1].is_contiguous()  # Q, as the decode kernels take it
    attn = torch.randn(3, m.q_size, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(layer_tail(m, stacked, hidden, attn, fused),
                               layer_tail(m, separate, hidden, attn), rtol=1e-5, atol=1e-6)
