"""The attention input is the family's norm, and the projections refuse inputs of the wrong
shapes by name."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.attention import attention_input, project_kv
from kvlab.model.weights import AttentionWeights


def test_attention_input_is_the_family_norm():
    opt, llama = MODELS["tiny-opt"], MODELS["tiny-llama"]
    hidden = torch.randn(4, 256, dtype=torch.float64)
    w = AttentionWeights.random(opt, seed=2, dtype=torch.float64)
    ln = torch.nn.LayerNorm(256, eps=1e-5, dtype=torch.float64)
    ln.weight.data, ln.bias.data = w.norm_weight, w.norm_bias
    assert torch.allclose(attention_input(opt, w, hidden), ln(hidden))
    w = AttentionWeights.random(llama, seed=2, dtype=torch.float64)
    rms = hidden / hidden.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w.norm_weight
    assert torch.allclose(attention_input(llama, w, hidden), rms)
    assert w.norm_bias is None and w.b_k is None


def test_bad_shapes_are_refused():
    model = MODELS["tiny-llama"]
    w = AttentionWeights.random(model, seed=0)
    with pytest.raises(ValueError, match=r"x.shape=\(3, 128\): must be \[tokens, 256\]"):
        project_kv(model, w, torch.zeros(3, 128), torch.arange(3))
    with pytest.raises(ValueError, match=r"positions.shape=\(2,\): must be \(3,\)"):
        project_kv(model, w, torch.zeros(3, 256), torch.arange(2))
