"""A local Hugging Face checkpoint (a folder with config.json and *.safetensors) as a ModelConfig
and ModelWeights. Nothing is ever downloaded.

Supported: `model_type` "llama" (SiLU MLP, no attention or MLP biases; Llama 3's rope scaling),
"qwen2" (Q, K, V biases; full attention in every layer) and "opt" (pre-LayerNorm, ReLU,
word_embed_proj_dim = hidden_size, i.e. not opt-350m). Anything else is refused with the field
that differs: sliding windows, logit softcapping, partial rotary, quantization among them.
Weights are the tensors of `model.safetensors`, or of the shards `model.safetensors.index.json`
lists (plain file names in the folder). With `tie_word_embeddings` (HF's default: true for OPT,
false for Llama and Qwen2) a missing lm_head takes the token embedding; without, it is an error.

Every file is checked before any tensor is read: the config's values, the index, and each tensor's
shape and dtype from the safetensors headers. Each error is a ValueError naming the file, the key
or tensor, and the value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch

from kvlab.checks import check_bool, check_int, check_real
from kvlab.config import ModelConfig, RopeScaling
from kvlab.engine.weights import ModelWeights
from kvlab.model.weights import AttentionWeights, LayerWeights, named_tensors, resolve_device

SUPPORTED = ("llama", "qwen2", "opt")
TIED_BY_DEFAULT = {"llama": False, "qwen2": False, "opt": True}  # HF's tie_word_embeddings
MAX_SIZE = 2**31 - 1  # the kernels index each side of a weight with an int32
FLOATS = ("F16", "BF16", "F32", "F64")  # safetensors' dtype names
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
# config.json fields that ask for math kvlab does not do, with the value that asks for none
PLAIN_MATH = {"attn_logit_softcapping": None, "final_logit_softcapping": None,
              "partial_rotary_factor": 1.0, "quantization_config": None}
OPT_LAYERS = {"do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True,
              "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False}
# LayerWeights' fields (dotted, as kvlab.model.weights.named_tensors names them) -> HF's names
# in one layer; a family's layers have the fields its LayerWeights.random gives (biases for qwen2)
QKV_NAMES = {f"attn.{kind[0]}_{x}": f"self_attn.{x}_proj.{kind}" for x in "qkv"
             for kind in ("weight", "bias")}
LAYER_NAMES = {
    "llama": {**QKV_NAMES, "attn.w_o": "self_attn.o_proj.weight",
              "attn.norm_weight": "input_layernorm.weight",
              "mlp_norm_weight": "post_attention_layernorm.weight",
              "w_gate": "mlp.gate_proj.weight", "w_up": "mlp.up_proj.weight",
              "w_down": "mlp.down_proj.weight"},
    "opt": {**QKV_NAMES, "attn.w_o": "self_attn.out_proj.weight",
            "b_o": "self_attn.out_proj.bias", "attn.norm_weight": "self_attn_layer_norm.weight",
            "attn.norm_bias": "self_attn_layer_norm.bias",
            "mlp_norm_weight": "final_layer_norm.weight", "mlp_norm_bias": "final_layer_norm.bias",
            "w_up": "fc1.weight", "b_up": "fc1.bias", "w_down": "fc2.weight", "b_down": "fc2.bias"},
}


def is_checkpoint(path) -> bool:
    """Whether `path` (a str or os.PathLike) names a folder holding a config.json; False for
    anything else, never an error."""
    if not isinstance(path, (str, os.PathLike)) or path == "":
        return False
    try:
        return (Path(path) / "config.json").is_file()
    except (OSError, TypeError, ValueError):  # a name too long, a bytes path, a NUL
        return False


def model_config(path) -> ModelConfig:
    """The ModelConfig of the checkpoint at `path` (named after its folder). Raises ValueError
    naming the config.json field that is malformed or that kvlab cannot run, and its value."""
    folder = _folder(path)
    file = folder / "config.json"
    config = _read_json(file)
    kind = config.get("model_type")
    if kind not in SUPPORTED:
        raise ValueError(f"{folder}: model_type={kind!r} in config.json; kvlab runs "
                         f"{', '.join(SUPPORTED)}")
    _tied(config, kind, file)
    sizes = {key: _size(config, key, file) for key in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
        "max_position_embeddings", "ffn_dim" if kind == "opt" else "intermediate_size")}
    layers, hidden, heads, vocab, max_position, ffn = sizes.values()
    _require(folder, kind, config, PLAIN_MATH, none_means=("partial_rotary_factor",))
    if kind == "opt":
        _require(folder, kind, config, {**OPT_LAYERS, "word_embed_proj_dim": hidden},
                 none_means=("word_embed_proj_dim",))
        return _model(file, folder.name, "opt", layers, hidden, heads, heads,
                      _head_dim(config, file, hidden, heads, given=False), ffn, vocab,
                      max_position, "layernorm", "relu", "learned", True)
    _require(folder, kind, config, {"hidden_act": "silu", "attention_bias": kind == "qwen2",
                                    "mlp_bias": False})
    _check_full_attention(folder, config, file, layers)
    kv_heads = config.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _size(config, "num_key_value_heads", file)
    theta, scaling = _rope(folder, kind, config, file)
    return _model(file, folder.name, kind, layers, hidden, heads, kv_heads,
                  _head_dim(config, file, hidden, heads, given=True), ffn, vocab, max_position,
                  "rmsnorm", "silu", "rope", kind == "qwen2", rope_theta=theta,
                  norm_eps=config.get("rms_norm_eps", 1e-6), rope_scaling=scaling)


def load_weights(path, model: ModelConfig, dtype, device) -> ModelWeights:
    """The checkpoint's tensors as ModelWeights of `dtype` (a floating point torch.dtype) on
    `device`. Raises ValueError, before any tensor is read, naming an argument, a malformed
    config.json, index or safetensors file, or a tensor that is missing, of the wrong shape or
    not of a float dtype; RuntimeError without the safetensors package."""
    safe_open, safetensor_error = _safetensors()
    folder = _folder(path)
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model={model!r}: must be a ModelConfig")
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype={dtype!r}: must be a floating point torch.dtype")
    device = resolve_device(device)
    tied = ties_lm_head(folder, model)
    model_names, layer_names = _names(model)
    shapes = _shapes(model, dtype, model_names, layer_names, folder)
    headers = _headers(folder, safe_open, safetensor_error)
    _check_tensors(folder, model, shapes, headers, model_names["lm_head"] if tied else None)
    by_file, tensors = {}, {}
    for name in shapes:
        if name in headers:
            by_file.setdefault(headers[name][0], []).append(name)
    for file, names in by_file.items():
        try:
            with safe_open(file, framework="pt") as f:
                tensors.update({name: f.get_tensor(name).to(device=device, dtype=dtype)
                                for name in names})
        except (OSError, safetensor_error) as err:
            raise ValueError(f"{file}: not a safetensors file ({err})") from None
    weights = _assemble(tensors, model_names, layer_names)
    weights.check(model)
    return weights


def ties_lm_head(path, model: ModelConfig) -> bool:
    """Whether the checkpoint at `path` uses its embedding as its LM head
    (tie_word_embeddings in its config.json, else HF's default for `model`'s family)."""
    folder = _folder(path)
    return _tied(_read_json(folder / "config.json"), model.family, folder / "config.json")


def load(path, dtype, device) -> tuple[ModelConfig, ModelWeights]:
    """(ModelConfig, ModelWeights) of the checkpoint folder at `path`; raises what
    `model_config` and `load_weights` raise."""
    model = model_config(path)
    return model, load_weights(path, model, dtype, device)


def _folder(path) -> Path:
    if not is_checkpoint(path):
        raise ValueError(f"path={path!r}: must be a checkpoint folder holding a config.json")
    return Path(path)


def _read_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not UTF-8 or not JSON
        raise ValueError(f"{file}: not a JSON file ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: must hold a JSON object, not {type(data).__name__}")
    return data


def _size(config: dict, key: str, file: Path) -> int:
    if key not in config:
        raise ValueError(f"{file}: no {key}")
    check_int(f"{file}: {key}", config[key], 1, MAX_SIZE)
    return config[key]


def _head_dim(config: dict, file: Path, hidden: int, heads: int, *, given: bool) -> int:
    """config's head_dim where the family reads one (`given`) and it is set, else hidden / heads
    (which must then divide)."""
    if given and config.get("head_dim") is not None:
        return _size(config, "head_dim", file)
    if hidden % heads:
        raise ValueError(f"{file}: hidden_size={hidden}: must be divisible by "
                         f"num_attention_heads={heads}")
    return hidden // heads


def _tied(config: dict, kind: str, file: Path) -> bool:
    tied = config.get("tie_word_embeddings", TIED_BY_DEFAULT[kind])
    check_bool(f"{file}: tie_word_embeddings", tied)
    return bool(tied)


def _require(folder: Path, kind: str, config: dict, wanted: dict,
             none_means: tuple[str, ...] = ()) -> None:
    """ValueError naming the first field of config.json that is set and differs from `wanted`
    (for the keys in `none_means`, null stands for the wanted value, as HF reads it)."""
    for key, want in wanted.items():
        got = config.get(key, want)
        if got != want and not (got is None and key in none_means):
            raise ValueError(f"{folder}: {key}={got!r} in config.json; kvlab's {kind} layers "
                             f"need {want!r}")


def _check_full_attention(folder: Path, config: dict, file: Path, num_layers: int) -> None:
    """ValueError if any layer slides, as HF's Qwen2Config decides: by `layer_types` where set,
    else layers from `max_window_layers` on when `use_sliding_window` and `sliding_window`."""
    layer_types = config.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list):
            raise ValueError(f"{file}: layer_types={layer_types!r}: must be a list")
        for i, kind in enumerate(layer_types):
            if kind != "full_attention":
                raise ValueError(f"{folder}: layer_types[{i}]={kind!r} in config.json; kvlab "
                                 "runs 'full_attention' only")
        return
    use = config.get("use_sliding_window", False)
    check_bool(f"{file}: use_sliding_window", use)
    window = config.get("sliding_window")
    if not use or window is None:
        return
    first = config.get("max_window_layers", 28)  # HF's Qwen2Config default
    check_int(f"{file}: max_window_layers", first, 0)
    if first < num_layers:
        raise ValueError(f"{folder}: use_sliding_window=True in config.json with "
                         f"sliding_window={window!r}, max_window_layers={first}: layers "
                         f"{first} to {num_layers - 1} slide; kvlab runs full attention only")


def _rope(folder: Path, kind: str, config: dict,
          file: Path) -> tuple[float, RopeScaling | None]:
    """(rope_theta, Llama 3's scaling or None) as HF reads them from rope_parameters (or the
    older rope_scaling) and rope_theta."""
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    rope = config.get(key) or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{file}: {key}={rope!r}: must be a dict")
    if any(isinstance(value, dict) for value in rope.values()):
        raise ValueError(f"{folder}: {key}={rope!r} in config.json; kvlab runs one rope for "
                         "all layers")
    _require(folder, kind, {f"{key}.{k}": v for k, v in rope.items()},
             {f"{key}.partial_rotary_factor": 1.0}, none_means=(f"{key}.partial_rotary_factor",))
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))  # HF's default_theta
    check_real(f"{file}: rope_theta", theta, 0, open_min=True)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise ValueError(f"{folder}: rope_type={rope_type!r} in config.json; kvlab runs "
                         "'default' and 'llama3'")
    if rope_type == "default":
        return float(theta), None
    factors = []
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        if name not in rope:
            raise ValueError(f"{file}: no {name} in {key} (rope_type 'llama3')")
        check_real(f"{file}: {key}.{name}", rope[name], 0, open_min=True)
        factors.append(rope[name])
    # HF's order: config's own original_max_position_embeddings, the rope's, max_position
    original = config.get("original_max_position_embeddings",
                          rope.get("original_max_position_embeddings",
                                   config["max_position_embeddings"]))
    check_int(f"{file}: original_max_position_embeddings", original, 1, MAX_SIZE)
    try:
        return float(theta), RopeScaling(*factors, original)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None


def _model(file: Path, *args, **kwargs) -> ModelConfig:
    """ModelConfig(*args, **kwargs), its errors prefixed with the config.json they came from."""
    try:
        return ModelConfig(*args, **kwargs)
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None


def _safetensors():
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError as err:
        raise RuntimeError("reading a checkpoint needs safetensors: pip install safetensors"
                           ) from err
    return safe_open, SafetensorError


def _names(model: ModelConfig) -> tuple[dict[str, str], list[dict[str, str]]]:
    """HF's tensor names: {ModelWeights field: name} and, per layer, {dotted LayerWeights field:
    name}, for every field the family may have."""
    opt = model.family == "opt"
    top = "model.decoder." if opt else "model."
    norm = top + ("final_layer_norm" if opt else "norm")
    model_names = {"embed": top + "embed_tokens.weight",
                   "positions": top + "embed_positions.weight", "norm_weight": norm + ".weight",
                   "norm_bias": norm + ".bias", "lm_head": "lm_head.weight"}
    layer = LAYER_NAMES["opt" if opt else "llama"]
    return model_names, [{field: f"{top}layers.{i}.{name}" for field, name in layer.items()}
                         for i in range(model.num_layers)]


def _shapes(model: ModelConfig, dtype, model_names: dict, layer_names: list,
            folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor `model` reads, by HF name, with its shape: the layers' first, as in the files.
    The shapes are those of weights on the "meta" device (nothing allocated)."""
    try:
        reference = ModelWeights.random(dataclasses.replace(model, num_layers=1), 0, dtype,
                                        "meta")
    except RuntimeError as err:  # a tensor of 2**63 bytes or more
        raise ValueError(f"{folder}: {model.name}'s weights are too large ({err})") from None
    layer_shapes = {f: tuple(t.shape) for f, t in named_tensors(reference.layers[0]).items()}
    shapes = {names[f]: shape for names in layer_names for f, shape in layer_shapes.items()}
    shapes.update({name: tuple(getattr(reference, f).shape) for f, name in model_names.items()
                   if getattr(reference, f) is not None})
    return shapes


def _check_tensors(folder: Path, model: ModelConfig, shapes: dict, headers: dict,
                   optional: str | None) -> None:
    """ValueError naming the first tensor of `shapes` (but `optional`) that the checkpoint's
    `headers` lack, or give another shape, or a dtype that is not a float."""
    for name, shape in shapes.items():
        if name not in headers:
            if name == optional:
                continue
            why = " (tie_word_embeddings=False in config.json)" if "lm_head" in name else ""
            raise ValueError(f"{folder}: no tensor {name!r} in the checkpoint{why}")
        file, got, kind = headers[name]
        if tuple(got) != shape:
            raise ValueError(f"{file}: tensor {name!r} has shape {tuple(got)}, must be {shape} "
                             f"for {model.name}")
        if kind not in FLOATS:
            raise ValueError(f"{file}: tensor {name!r} has dtype {kind}, must be a float: "
                             f"{', '.join(FLOATS[:-1])} or {FLOATS[-1]}")


def _weight_map(index: Path) -> dict[str, str]:
    """The index's {tensor name: file name}; each file name plain (no folder, not '..')."""
    data = _read_json(index)
    if "weight_map" not in data:
        raise ValueError(f"{index}: no weight_map")
    weight_map = data["weight_map"]
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index}: weight_map={weight_map!r}: must be a dict of tensor names "
                         "to file names")
    for name, file in weight_map.items():
        if (not isinstance(file, str) or file in ("", ".", "..") or Path(file).name != file
                or "\\" in file):
            raise ValueError(f"{index}: weight_map[{name!r}]={file!r}: must be a plain file name "
                             f"in {index.parent}")
    return weight_map


def _headers(folder: Path, safe_open, safetensor_error) -> dict[str, tuple[Path, list, str]]:
    """Every tensor of the checkpoint: {name: (file, shape, safetensors dtype)}, read from the
    files' headers only."""
    index = folder / INDEX
    if index.is_file():
        weight_map = _weight_map(index)
        names = sorted(set(weight_map.values()))
    elif (folder / SINGLE).is_file():
        weight_map, names = None, [SINGLE]
    else:
        raise ValueError(f"{folder}: no {SINGLE} or {INDEX}: kvlab reads safetensors "
                         "checkpoints")
    headers = {}
    for name in names:
        file = folder / name
        if not file.is_file():
            raise ValueError(f"{folder}: no {name}, which {INDEX} names")
        try:
            with safe_open(file, framework="pt") as f:
                for key in f.keys():
                    if weight_map is None or weight_map.get(key) == name:
                        tensor = f.get_slice(key)
                        headers[key] = (file, tensor.get_shape(), tensor.get_dtype())
        except (OSError, safetensor_error) as err:
            raise ValueError(f"{file}: not a safetensors file ({err})") from None
    return headers


def _assemble(tensors: dict, model_names: dict, layer_names: list) -> ModelWeights:
    """ModelWeights from the read tensors (None where a field's tensor was not read); a tied
    lm_head that the checkpoint lacks is the embedding."""
    def layer(names: dict) -> LayerWeights:
        attn = AttentionWeights(**{f.name: tensors.get(names.get(f"attn.{f.name}"))
                                   for f in dataclasses.fields(AttentionWeights)})
        return LayerWeights(attn, **{f.name: tensors.get(names.get(f.name))
                                     for f in dataclasses.fields(LayerWeights)
                                     if f.name != "attn"})

    top = {field: tensors.get(name) for field, name in model_names.items()}
    if top["lm_head"] is None:
        top["lm_head"] = top["embed"]
    return ModelWeights(layers=[layer(names) for names in layer_names], **top)
