"""HF transformers models built around kvlab's decoder layers: the same tensors, not copies.

KVPR's third baseline is HF's offloaded KV cache (`cache_implementation="offloaded"`, a
`DynamicCache` with `offloading=True`) on the same model with the same weights. `causal_lm` builds
the HF causal LM of a model's shapes whose decoder layers use the given `LayerWeights` tensors;
only the embeddings, the final norm and the LM head are new (seeded random). The exactness tests
use `load_layer` to check kvlab's layer math against HF's.

transformers is imported inside the functions: it is an optional dependency.
"""

from __future__ import annotations

import copy
import inspect

import torch

from kvlab.checks import check_int, check_positive_int
from kvlab.config import ModelConfig
from kvlab.model.weights import LayerWeights


def hf_config(model: ModelConfig, num_layers: int | None = None,
              max_position: int | None = None):
    """The transformers config of `model`'s shapes (OPT: pre-LayerNorm, biases; Llama / Qwen2:
    RMSNorm of model.norm_eps, RoPE theta and Llama 3 scaling, GQA). `max_position`: learned
    positions to allocate (OPT) or the RoPE window to declare; default the model's published
    one. ValueError unless num_layers and max_position are positive integers or None."""
    for name, value in (("num_layers", num_layers), ("max_position", max_position)):
        if value is not None:
            check_positive_int(name, value)
    import transformers

    common = dict(hidden_size=model.hidden_size, num_attention_heads=model.num_qo_heads,
                  num_hidden_layers=model.num_layers if num_layers is None else num_layers,
                  max_position_embeddings=max(model.max_position, max_position or 0),
                  vocab_size=model.vocab_size)
    if model.family == "opt":
        return transformers.OPTConfig(ffn_dim=model.intermediate_size, enable_bias=True,
                                      word_embed_proj_dim=model.hidden_size,
                                      do_layer_norm_before=True, **common)
    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}
    if model.family not in config_class:
        raise ValueError(f"model.family={model.family!r}: must be opt, llama or qwen2")
    rope = {"rope_theta": model.rope_theta}
    if model.rope_scaling is not None:
        s = model.rope_scaling
        rope["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor,
                                "low_freq_factor": s.low_freq_factor,
                                "high_freq_factor": s.high_freq_factor,
                                "original_max_position_embeddings": s.original_max_position}
    return config_class[model.family](
        intermediate_size=model.intermediate_size, head_dim=model.head_dim,
        num_key_value_heads=model.num_kv_heads, rms_norm_eps=model.norm_eps, **rope, **common,
    )


def _classes(family: str):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.opt.modeling_opt import OPTDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    return {
        "opt": (transformers.OPTForCausalLM, OPTDecoderLayer),
        "llama": (transformers.LlamaForCausalLM, LlamaDecoderLayer),
        "qwen2": (transformers.Qwen2ForCausalLM, Qwen2DecoderLayer),
    }[family]


def load_layer(layer, family: str, w: LayerWeights) -> None:
    """Make the HF decoder layer `layer` use `w`'s tensors (shared, not copied)."""
    attn = layer.self_attn
    if family == "opt":
        out = attn.out_proj
        pairs = [(layer.fc1, w.w_up, w.b_up), (layer.fc2, w.w_down, w.b_down),
                 (layer.self_attn_layer_norm, w.attn.norm_weight, w.attn.norm_bias),
                 (layer.final_layer_norm, w.mlp_norm_weight, w.mlp_norm_bias)]
    else:
        out = attn.o_proj
        pairs = [(layer.mlp.gate_proj, w.w_gate, None), (layer.mlp.up_proj, w.w_up, None),
                 (layer.mlp.down_proj, w.w_down, None),
                 (layer.input_layernorm, w.attn.norm_weight, None),
                 (layer.post_attention_layernorm, w.mlp_norm_weight, None)]
    pairs += [(attn.q_proj, w.attn.w_q, w.attn.b_q), (attn.k_proj, w.attn.w_k, w.attn.b_k),
              (attn.v_proj, w.attn.w_v, w.attn.b_v), (out, w.attn.w_o, w.b_o)]
    share(pairs)


def share(pairs) -> None:
    """Make each HF module use the given tensors, (module, weight, bias or None) triples: the
    same storage as parameters, not copies."""
    for module, weight, bias in pairs:
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            module.bias = torch.nn.Parameter(bias, requires_grad=False)


def causal_lm(model: ModelConfig, layers: list[LayerWeights], device, seed: int = 0,
              max_position: int | None = None):
    """The HF causal LM of `model` in eval mode whose decoder layers share `layers`' tensors
    (dtype and device theirs); embeddings, final norm and LM head seeded random on `device`.
    The layers are built on the meta device, so no second copy of the weights is allocated.
    ValueError for a layer count not the model's, or a seed not in [0, 2**63 - 1]."""
    if len(layers) != model.num_layers:
        raise ValueError(f"len(layers)={len(layers)}: must be {model.name}'s {model.num_layers}")
    check_int("seed", seed, 0, 2**63 - 1)
    lm_class, layer_class = _classes(model.family)
    config = hf_config(model, max_position=max_position)
    config._attn_implementation = "sdpa"
    shell = copy.deepcopy(config)
    shell.num_hidden_layers = 0
    dtype = layers[0].w_up.dtype
    torch.manual_seed(seed)
    with torch.device(device):
        hf = lm_class._from_config(shell, dtype=dtype)
    for module in hf.modules():
        if getattr(module, "config", None) is shell:
            module.config = config
    decoder = hf.model.decoder if model.family == "opt" else hf.model
    for i, w in enumerate(layers):
        with torch.device("meta"):
            layer = layer_class(config, layer_idx=i)
        load_layer(layer, model.family, w)
        layer.to(dtype)  # nothing left on meta; casts nothing of ours
        decoder.layers.append(layer)
    left = [name for name, p in hf.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"parameters without weights: {left[:5]}")
    return hf.eval()


def cache_keyword(hf) -> str:
    """The forward keyword of the KV cache: "cache" from transformers 5.24 on (where
    `past_key_values` is deprecated), "past_key_values" before."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
