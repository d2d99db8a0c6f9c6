"""The layer math the KVPR runtime runs equals HF transformers' decoder layers with the same
weights (CPU, float64): the norm, the projections with their biases, RoPE, GQA, the MLP and the
residuals of OPT, Llama and Qwen2. The remaining difference is HF's fp32 softmax and RoPE angles."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.offload.model import LayerWeights, decode_layer
from kvlab.offload.recompute import attention_input, project_kv

transformers = pytest.importorskip("transformers")
TOKENS = 9


def hf_model(name):
    """An HF model of `name`'s tiny shape, two layers, eager attention, float64."""
    m = MODELS[name]
    common = dict(hidden_size=m.hidden_size, num_attention_heads=m.num_qo_heads,
                  num_hidden_layers=2, max_position_embeddings=m.max_position,
                  vocab_size=m.vocab_size)
    if m.family == "opt":
        config = transformers.OPTConfig(ffn_dim=m.intermediate_size, enable_bias=True,
                                        word_embed_proj_dim=m.hidden_size,
                                        do_layer_norm_before=True, **common)
        model_class = transformers.OPTModel
    else:
        config_class, model_class = {
            "llama": (transformers.LlamaConfig, transformers.LlamaModel),
            "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
        }[m.family]
        config = config_class(intermediate_size=m.intermediate_size, head_dim=m.head_dim,
                              num_key_value_heads=m.num_kv_heads, rms_norm_eps=1e-6,
                              rope_theta=m.rope_theta, **common)
    config._attn_implementation = "eager"
    return model_class(config).double().eval()


def load_layer(hf, family, w):
    """Copy our weights into the HF model's first layer."""
    with torch.no_grad():
        if family == "opt":
            layer = hf.decoder.layers[0]
            attn, out = layer.self_attn, layer.self_attn.out_proj
            pairs = [(layer.fc1, w.w_up, w.b_up), (layer.fc2, w.w_down, w.b_down),
                     (layer.self_attn_layer_norm, w.attn.norm_weight, w.attn.norm_bias),
                     (layer.final_layer_norm, w.mlp_norm_weight, w.mlp_norm_bias)]
        else:
            layer = hf.layers[0]
            attn, out = layer.self_attn, layer.self_attn.o_proj
            pairs = [(layer.mlp.gate_proj, w.w_gate, None), (layer.mlp.up_proj, w.w_up, None),
                     (layer.mlp.down_proj, w.w_down, None),
                     (layer.input_layernorm, w.attn.norm_weight, None),
                     (layer.post_attention_layernorm, w.mlp_norm_weight, None)]
        pairs += [(attn.q_proj, w.attn.w_q, w.attn.b_q), (attn.k_proj, w.attn.w_k, w.attn.b_k),
                  (attn.v_proj, w.attn.w_v, w.attn.b_v), (out, w.attn.w_o, w.b_o)]
        for module, weight, bias in pairs:
            module.weight.copy_(weight)
            if bias is not None:
                module.bias.copy_(bias)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
def test_decode_layer_equals_hf_transformers(name):
    m = MODELS[name]
    w = LayerWeights.random(m, seed=1, dtype=torch.float64)
    hf = hf_model(name)
    load_layer(hf, m.family, w)
    embeds = torch.randn(1, TOKENS, m.hidden_size, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(2))
    states = hf(inputs_embeds=embeds, output_hidden_states=True).hidden_states
    layer_in, expected = states[0][0], states[1][0, -1]  # OPT adds its positions to states[0]
    # our side: the cache of the first TOKENS - 1 tokens, then one decode step for the last
    x = attention_input(m, w.attn, layer_in[:-1])
    k = torch.zeros(TOKENS, 1, m.num_kv_heads, m.head_dim, dtype=torch.float64)
    v = torch.zeros_like(k)
    k[:-1, 0], v[:-1, 0] = project_kv(m, w.attn, x, torch.arange(TOKENS - 1))
    got, _ = decode_layer(m, w, layer_in[-1:], TOKENS - 1, k, v)
    torch.testing.assert_close(got[0], expected, rtol=1e-6, atol=1e-6)
