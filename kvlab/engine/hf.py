"""The HF transformers causal LM with an engine model's weights: its decoder layers are
`kvlab.model.hf.causal_lm`'s (sharing the layers' tensors) and its embeddings, final norm and
LM head share `ModelWeights`' tensors too, so both compute with the same numbers.

transformers is imported inside `causal_lm`: it is an optional dependency.
"""

from __future__ import annotations

from kvlab.config import ModelConfig
from kvlab.engine.weights import ModelWeights
from kvlab.model import hf as layers_hf


def causal_lm(model: ModelConfig, w: ModelWeights):
    """The HF `LlamaForCausalLM`, `Qwen2ForCausalLM` or `OPTForCausalLM` (eval mode, SDPA
    attention) computing `model` with the weights `w`, on their device and dtype."""
    w.check(model)
    hf = layers_hf.causal_lm(model, w.layers, w.device)
    inner = hf.model.decoder if model.family == "opt" else hf.model
    pairs = [(inner.embed_tokens, w.embed, None), (hf.lm_head, w.lm_head, None)]
    if model.family == "opt":
        pairs += [(inner.embed_positions, w.positions, None),
                  (inner.final_layer_norm, w.norm_weight, w.norm_bias)]
    else:
        pairs += [(inner.norm, w.norm_weight, None)]
    layers_hf.share(pairs)
    return hf
