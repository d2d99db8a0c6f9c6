"""A local Hugging Face checkpoint (a folder with config.json and *.safetensors) as a ModelConfig
and ModelWeights. Nothing is ever downloaded.

Supported: `model_type` "llama" (SiLU MLP, no attention or MLP biases; Llama 3's rope scaling),
"qwen2" (Q, K, V biases) and "opt" (pre-LayerNorm, ReLU, word_embed_proj_dim = hidden_size, i.e.
not opt-350m). Anything else is refused with the field that differs. Weights are the tensors of
`model.safetensors`, or of the shards `model.safetensors.index.json` lists; a missing lm_head
(tied embeddings) takes the token embedding.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.config import ModelConfig, RopeScaling
from kvlab.engine.weights import ModelWeights
from kvlab.offload.model import LayerWeights, resolve_device
from kvlab.offload.recompute import AttentionWeights

SUPPORTED = ("llama", "qwen2", "opt")


def is_checkpoint(path) -> bool:
    """Whether `path` names a folder holding a config.json."""
    return isinstance(path, (str, Path)) and (Path(path) / "config.json").is_file()


def model_config(path) -> ModelConfig:
    """The ModelConfig of the checkpoint at `path` (named after its folder). Raises ValueError
    naming the setting kvlab cannot run."""
    folder = Path(path)
    config = json.loads((folder / "config.json").read_text())
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"{folder}: model_type={kind!r} in config.json; kvlab runs "
                         f"{', '.join(SUPPORTED)}")
    heads = config["num_attention_heads"]
    if kind == "opt":
        for key, want in (("do_layer_norm_before", True), ("activation_function", "relu"),
                          ("word_embed_proj_dim", config["hidden_size"]),
                          ("enable_bias", True)):
            if config.get(key, want) != want:
                raise ValueError(f"{folder}: {key}={config.get(key)!r} in config.json; kvlab's "
                                 f"OPT layers need {want!r}")
        return ModelConfig(
            folder.name, "opt", config["num_hidden_layers"], config["hidden_size"], heads, heads,
            config["hidden_size"] // heads, config["ffn_dim"], config["vocab_size"],
            config["max_position_embeddings"], "layernorm", "relu", "learned", True)
    for key, want in (("hidden_act", "silu"), ("attention_bias", kind == "qwen2"),
                      ("mlp_bias", False)):
        if config.get(key, want) != want:
            raise ValueError(f"{folder}: {key}={config.get(key)!r} in config.json; kvlab's "
                             f"{kind} layers need {want!r}")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"{folder}: rope_type={rope_type!r} in config.json; kvlab runs "
                         "'default' and 'llama3'")
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScaling(rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"],
                              rope["original_max_position_embeddings"])
    return ModelConfig(
        folder.name, kind, config["num_hidden_layers"], config["hidden_size"], heads,
        config.get("num_key_value_heads", heads),
        config.get("head_dim") or config["hidden_size"] // heads, config["intermediate_size"],
        config["vocab_size"], config["max_position_embeddings"], "rmsnorm", "silu", "rope",
        kind == "qwen2", rope_theta=float(theta), norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_scaling=scaling)


def load_weights(path, model: ModelConfig, dtype, device) -> ModelWeights:
    """The checkpoint's tensors as ModelWeights of `dtype` on `device`; ValueError names a
    tensor that is missing or of the wrong shape."""
    try:
        from safetensors.torch import load_file
    except ImportError as err:
        raise RuntimeError("reading a checkpoint needs safetensors: pip install safetensors"
                           ) from err
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.is_file() else ["model.safetensors"])
    tensors = {}
    for name in files:
        if not (folder / name).is_file():
            raise ValueError(f"{folder}: no {name} (kvlab reads safetensors checkpoints)")
        tensors.update(load_file(folder / name))
    device = resolve_device(device)

    def take(name: str, optional: bool = False):
        t = tensors.get(name)
        if t is None:
            if optional:
                return None
            raise ValueError(f"{folder}: no tensor {name!r} in the checkpoint")
        return t.to(device=device, dtype=dtype)

    opt = model.family == "opt"
    top = "model.decoder." if opt else "model."
    layers = []
    for i in range(model.num_layers):
        p = f"{top}layers.{i}."
        a = p + "self_attn."
        bias = opt or model.qkv_bias
        attn = AttentionWeights(
            w_q=take(a + "q_proj.weight"), w_k=take(a + "k_proj.weight"),
            w_v=take(a + "v_proj.weight"),
            w_o=take(a + ("out_proj" if opt else "o_proj") + ".weight"),
            b_q=take(a + "q_proj.bias") if bias else None,
            b_k=take(a + "k_proj.bias") if bias else None,
            b_v=take(a + "v_proj.bias") if bias else None,
            norm_weight=take(p + ("self_attn_layer_norm" if opt else "input_layernorm")
                             + ".weight"),
            norm_bias=take(p + "self_attn_layer_norm.bias") if opt else None)
        if opt:
            layers.append(LayerWeights(
                attn, take(a + "out_proj.bias"), take(p + "final_layer_norm.weight"),
                take(p + "final_layer_norm.bias"), None, take(p + "fc1.weight"),
                take(p + "fc1.bias"), take(p + "fc2.weight"), take(p + "fc2.bias")))
        else:
            layers.append(LayerWeights(
                attn, None, take(p + "post_attention_layernorm.weight"), None,
                take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight"), None,
                take(p + "mlp.down_proj.weight"), None))
    embed = take(top + "embed_tokens.weight")
    norm = top + ("final_layer_norm" if opt else "norm")
    lm_head = take("lm_head.weight", optional=True)
    weights = ModelWeights(
        embed=embed, positions=take(top + "embed_positions.weight") if opt else None,
        layers=layers, norm_weight=take(norm + ".weight"),
        norm_bias=take(norm + ".bias") if opt else None,
        lm_head=embed if lm_head is None else lm_head)
    weights.check(model)
    return weights


def load(path, dtype, device) -> tuple[ModelConfig, ModelWeights]:
    """(ModelConfig, ModelWeights) of the checkpoint folder at `path`."""
    model = model_config(path)
    return model, load_weights(path, model, dtype, device)
