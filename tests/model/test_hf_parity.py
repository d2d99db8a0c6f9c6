"""The layer math the KVPR runtime runs equals HF transformers' decoder layers with the same
weights (CPU, float64): the norm, the projections with their biases, RoPE, GQA, the MLP and the
residuals of OPT, Llama and Qwen2. The remaining difference is HF's fp32 softmax and RoPE angles.
The bridge refuses bad sizes and seeds by name."""

import re

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.attention import attention_input, project_kv
from kvlab.model.layer import decode_layer
from kvlab.model.weights import random_layers

transformers = pytest.importorskip("transformers")
from kvlab.model.hf import cache_keyword, causal_lm, hf_config  # noqa: E402  (needs transformers)

TOKENS = 9


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
def test_decode_layers_equal_hf_transformers(name):
    m = MODELS[name]
    layers = random_layers(m, seed=1, dtype=torch.float64)
    hf = causal_lm(m, layers, "cpu")
    hf.config._attn_implementation = "eager"
    embeds = torch.randn(1, TOKENS, m.hidden_size, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(2))
    states = hf.model(inputs_embeds=embeds, output_hidden_states=True).hidden_states
    # our side, per layer: the cache of the first TOKENS - 1 tokens, then one decode step for the
    # last (states[0] is the first layer's input: OPT adds its positions to the embeddings)
    for i, w in enumerate(layers[:-1]):
        layer_in, expected = states[i][0], states[i + 1][0, -1]
        x = attention_input(m, w.attn, layer_in[:-1])
        k = torch.zeros(TOKENS, 1, m.num_kv_heads, m.head_dim, dtype=torch.float64)
        v = torch.zeros_like(k)
        k[:-1, 0], v[:-1, 0] = project_kv(m, w.attn, x, torch.arange(TOKENS - 1))
        got, _ = decode_layer(m, w, layer_in[-1:], TOKENS - 1, k, v)
        torch.testing.assert_close(got[0], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
def test_causal_lm_shares_the_layers_tensors_and_decodes(name):
    m = MODELS[name]
    layers = random_layers(m, seed=1)
    hf = causal_lm(m, layers, "cpu", max_position=4096)
    assert hf.config.num_hidden_layers == m.num_layers
    assert hf.config.max_position_embeddings == max(4096, m.max_position)
    shared = {p.data_ptr() for p in hf.parameters()}
    assert all(w.attn.w_k.data_ptr() in shared and w.w_down.data_ptr() in shared
               for w in layers)
    cache = transformers.DynamicCache(config=hf.config)
    ids = torch.randint(0, m.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hf(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_keyword(hf): cache})
        out = hf(input_ids=ids[:, :1], use_cache=True, **{cache_keyword(hf): cache})
    assert out.logits.shape == (2, 1, m.vocab_size) and cache.get_seq_length() == 6


def test_causal_lm_refuses_a_wrong_layer_count():
    m = MODELS["tiny-llama"]
    with pytest.raises(ValueError, match="len\\(layers\\)=1: must be tiny-llama's 2"):
        causal_lm(m, random_layers(m, num_layers=1), "cpu")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_layers": -1}, "num_layers=-1"), ({"num_layers": True}, "num_layers=True"),
    ({"max_position": 0}, "max_position=0"), ({"max_position": 2.5}, "max_position=2.5"),
])
def test_hf_config_refuses_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message) + ": must be an integer"):
        hf_config(MODELS["tiny-llama"], **kwargs)


@pytest.mark.parametrize("seed", [2**70, -1, 2.5, True])
def test_causal_lm_refuses_a_seed_torch_cannot_take(seed):
    m = MODELS["tiny-llama"]
    with pytest.raises(ValueError, match=re.escape(f"seed={seed!r}: must be an integer")):
        causal_lm(m, random_layers(m, seed=0), "cpu", seed=seed)
