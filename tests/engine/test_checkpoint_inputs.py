"""Bad checkpoints are refused by kvlab.engine.checkpoint with a ValueError naming the file, the
key or tensor and the value, before any tensor is read into place: configs kvlab would run with
other math (sliding windows, softcapping, partial rotary, quantization), an untied model without
its LM head, shard names outside the folder, and malformed config.json, index or safetensors
files (CPU)."""

import json
import math
import os
import re

import pytest
import torch

import kvlab
from kvlab.engine import checkpoint

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402  (comes with transformers)

DIMS = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 64,
        "max_position_embeddings": 64}
CONFIGS = {
    "llama": lambda **kw: transformers.LlamaConfig(
        **DIMS, intermediate_size=256, num_key_value_heads=1, tie_word_embeddings=False, **kw),
    "qwen2": lambda **kw: transformers.Qwen2Config(
        **DIMS, intermediate_size=256, num_key_value_heads=1, **kw),
    "opt": lambda **kw: transformers.OPTConfig(**DIMS, ffn_dim=256, word_embed_proj_dim=128,
                                               **kw),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "opt": "OPTForCausalLM"}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
DROP = object()  # edit_config: remove the key


def make_checkpoint(tmp_path, kind: str = "llama", **config):
    """A tiny HF checkpoint of `kind` in tmp_path / kind; `config`: the HF config's arguments."""
    torch.manual_seed(0)
    path = tmp_path / kind
    getattr(transformers, CLASSES[kind])(CONFIGS[kind](**config)).save_pretrained(path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is DROP:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def edit_tensors(path, changes: dict):
    """Replace (or, with None, remove) tensors of model.safetensors."""
    file = path / "model.safetensors"
    tensors = load_file(file)
    for name, tensor in changes.items():
        if tensor is None:
            tensors.pop(name)
        else:
            tensors[name] = tensor
    save_file(tensors, file, metadata={"format": "pt"})


def refused(path, message: str):
    """load() raises a ValueError matching `message` (a regex)."""
    with pytest.raises(ValueError, match=message):
        checkpoint.load(path, torch.float32, "cpu")


# --- configs kvlab would run with other math ---

def test_a_qwen2_config_that_slides_a_layer_is_refused(tmp_path):
    path = make_checkpoint(tmp_path, "qwen2", use_sliding_window=True, sliding_window=4,
                           max_window_layers=1)
    refused(path, r"layer_types\[1\]='sliding_attention' in config.json")
    edit_config(path, layer_types=DROP)  # a config as published: HF derives layer_types
    refused(path, "use_sliding_window=True in config.json .*sliding_window=4, "
                  "max_window_layers=1")


@pytest.mark.parametrize("config", [
    {"use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28},
    {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2},
    {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0},
])
def test_a_qwen2_config_that_slides_no_layer_loads(tmp_path, config):
    path = make_checkpoint(tmp_path, "qwen2")
    edit_config(path, layer_types=DROP, **config)
    hf = transformers.Qwen2Config.from_pretrained(path)
    assert "sliding_attention" not in hf.layer_types  # HF runs full attention too
    model, weights = checkpoint.load(path, torch.float32, "cpu")
    assert model.family == "qwen2" and len(weights.layers) == 2


@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("llama", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 in config.json"),
    ("qwen2", {"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0 in config.json"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 in config.json"),
    ("llama", {"rope_parameters": {**LLAMA3_ROPE, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5 in config.json"),
    ("llama", {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     "quantization_config=.*gptq.* in config.json"),
    ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]},
     r"layer_types\[1\]='chunked_attention' in config.json"),
    ("llama", {"rope_parameters": {"full_attention": {"rope_type": "default"}}},
     "rope_parameters.*full_attention.* in config.json"),
    ("opt", {"layer_norm_elementwise_affine": False},
     "layer_norm_elementwise_affine=False in config.json"),
    ("opt", {"_remove_final_layer_norm": True}, "_remove_final_layer_norm=True in config.json"),
])
def test_fields_that_change_the_math_are_refused_by_name(tmp_path, kind, edit, message):
    path = make_checkpoint(tmp_path, kind)
    edit_config(path, **edit)
    refused(path, message)


def test_pretraining_tp_is_accepted_as_hf_runs_it(tmp_path):
    """HF's Llama ignores pretraining_tp (a split of the same matmuls): nothing to refuse."""
    path = make_checkpoint(tmp_path, "llama")
    edit_config(path, pretraining_tp=2)
    assert checkpoint.model_config(path).family == "llama"


# --- tied and untied LM heads ---

@pytest.mark.parametrize("tie", [False, DROP])  # Llama's default: untied
def test_an_untied_checkpoint_without_lm_head_is_refused(tmp_path, tie):
    path = make_checkpoint(tmp_path, "llama")
    edit_config(path, tie_word_embeddings=tie)
    edit_tensors(path, {"lm_head.weight": None})
    refused(path, r"no tensor 'lm_head.weight' .*tie_word_embeddings=False")


def test_a_tied_checkpoint_takes_the_embedding_or_its_stored_lm_head(tmp_path):
    path = make_checkpoint(tmp_path, "opt")
    edit_config(path, tie_word_embeddings=DROP)  # OPT's default: tied
    _, weights = checkpoint.load(path, torch.float32, "cpu")
    assert weights.lm_head is weights.embed
    stored = torch.randn(64, 128)
    edit_tensors(path, {"lm_head.weight": stored})  # HF 5 then runs the stored head
    _, weights = checkpoint.load(path, torch.float32, "cpu")
    torch.testing.assert_close(weights.lm_head, stored)


def test_tie_word_embeddings_must_be_a_bool(tmp_path):
    path = make_checkpoint(tmp_path, "qwen2")
    edit_config(path, tie_word_embeddings="yes")
    refused(path, "config.json: tie_word_embeddings='yes': must be True or False")


# --- shard names ---

def sharded(tmp_path):
    path = tmp_path / "qwen2"
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(CONFIGS["qwen2"]()).save_pretrained(path,
                                                                      max_shard_size="100KB")
    return path


def edit_index(path, rename: dict):
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: rename.get(v, v) for k, v in index["weight_map"].items()}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("where", ["../outside.safetensors", "{abs}", "sub/x.safetensors", "..",
                                   ".", "", "a\\b.safetensors"])
def test_an_index_naming_a_file_outside_the_folder_is_refused(tmp_path, where):
    path = sharded(tmp_path)
    first = sorted(p.name for p in path.glob("*.safetensors"))[0]
    outside = tmp_path / "outside.safetensors"
    (path / first).rename(outside)
    (path / "sub").mkdir()
    (path / "sub" / "x.safetensors").symlink_to(outside)
    name = where.format(abs=outside)
    edit_index(path, {first: name})
    refused(path, r"model\.safetensors\.index\.json: weight_map\[.*"
                  + re.escape(f"]={name!r}: must be a plain file name"))


def test_a_folder_of_symlinks_into_blobs_loads(tmp_path):
    """Hugging Face's hub cache: snapshots/<rev>/* are symlinks into ../../blobs/."""
    path = sharded(tmp_path)
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(path.iterdir())):
        file.rename(blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(os.path.join("..", "..", "blobs", f"blob{i}"))
    model, weights = checkpoint.load(snapshot, torch.float32, "cpu")
    assert model.name == "abc" and len(weights.layers) == 2


# --- malformed files ---

def write(text: str):
    return lambda path: (path / "config.json").write_text(text)


def config_edit(**changes):
    return lambda path: edit_config(path, **changes)


@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("llama", write("{not json"), "config.json: not a JSON file"),
    ("llama", write("[1, 2]"), "config.json: must hold a JSON object, not list"),
    ("llama", write(""), "config.json: not a JSON file"),
    ("llama", config_edit(hidden_size=DROP), "config.json: no hidden_size"),
    ("llama", config_edit(num_attention_heads=DROP), "config.json: no num_attention_heads"),
    ("qwen2", config_edit(vocab_size=DROP), "config.json: no vocab_size"),
    ("llama", config_edit(intermediate_size=DROP), "config.json: no intermediate_size"),
    ("opt", config_edit(ffn_dim=DROP), "config.json: no ffn_dim"),
    ("opt", config_edit(num_hidden_layers=DROP), "config.json: no num_hidden_layers"),
    ("qwen2", config_edit(max_position_embeddings=DROP),
     "config.json: no max_position_embeddings"),
    ("opt", config_edit(hidden_size=DROP), "config.json: no hidden_size"),
    ("llama", config_edit(rope_parameters={k: v for k, v in LLAMA3_ROPE.items()
                                           if k != "factor"}),
     "config.json: no factor in rope_parameters"),
    ("llama", config_edit(rope_parameters={k: v for k, v in LLAMA3_ROPE.items()
                                           if k != "high_freq_factor"}),
     "config.json: no high_freq_factor in rope_parameters"),
    ("llama", config_edit(rope_parameters={**LLAMA3_ROPE, "factor": "8"}),
     "config.json: rope_parameters.factor='8': must be a finite number > 0"),
    ("llama", config_edit(rope_parameters={**LLAMA3_ROPE, "factor": math.inf}),
     "config.json: rope_parameters.factor=inf"),
    ("llama", config_edit(rope_parameters={**LLAMA3_ROPE, "high_freq_factor": 0.5}),
     "config.json: rope_scaling: high_freq_factor=0.5 must be above"),
    ("llama", config_edit(rope_parameters=[1, 2]),
     r"config.json: rope_parameters=\[1, 2\]: must be a dict"),
    ("llama", config_edit(rope_parameters={"rope_type": "default", "rope_theta": "x"}),
     "config.json: rope_theta='x': must be a finite number > 0"),
    ("qwen2", config_edit(rope_parameters=DROP, rope_theta=math.nan),
     "config.json: rope_theta=nan"),
    ("llama", config_edit(hidden_size="128"), "config.json: hidden_size='128': must be an "
                                              "integer"),
    ("llama", config_edit(num_attention_heads=2.0), "config.json: num_attention_heads=2.0"),
    ("opt", config_edit(num_attention_heads=2.5), "config.json: num_attention_heads=2.5"),
    ("llama", config_edit(hidden_size=True), "config.json: hidden_size=True"),
    ("llama", config_edit(vocab_size=0), "config.json: vocab_size=0: must be an integer"),
    ("qwen2", config_edit(num_hidden_layers=-1), "config.json: num_hidden_layers=-1"),
    ("opt", config_edit(max_position_embeddings=2**70),
     f"config.json: max_position_embeddings={2**70}"),
    ("llama", config_edit(hidden_size=129, head_dim=DROP),
     "config.json: hidden_size=129: must be divisible by num_attention_heads=2"),
    ("opt", config_edit(hidden_size=129, word_embed_proj_dim=129),
     "config.json: hidden_size=129: must be divisible by num_attention_heads=2"),
    ("llama", config_edit(head_dim=0), "config.json: head_dim=0"),
    ("llama", config_edit(num_key_value_heads="1"), "config.json: num_key_value_heads='1'"),
    ("llama", config_edit(num_attention_heads=4, num_key_value_heads=3),
     "config.json: num_qo_heads=4: must be divisible by num_kv_heads=3"),
    ("llama", config_edit(rms_norm_eps="x"), "config.json: norm_eps='x'"),
    ("qwen2", config_edit(layer_types="full_attention"),
     "config.json: layer_types='full_attention': must be a list"),
    ("qwen2", config_edit(layer_types=DROP, use_sliding_window="no"),
     "config.json: use_sliding_window='no': must be True or False"),
    ("qwen2", config_edit(layer_types=DROP, use_sliding_window=True, sliding_window=4,
                          max_window_layers="2"),
     "config.json: max_window_layers='2'"),
])
def test_a_malformed_config_is_a_value_error_naming_file_key_and_value(tmp_path, kind, edit,
                                                                       message):
    path = make_checkpoint(tmp_path, kind)
    edit(path)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        checkpoint.model_config(path)
    refused(path, message.replace("(", r"\("))


def test_nothing_is_read_into_place_before_a_bad_last_tensor(tmp_path, monkeypatch):
    """A wrong final norm (the last tensor read) is refused before any tensor is converted."""
    path = make_checkpoint(tmp_path, "llama")
    edit_tensors(path, {"model.norm.weight": torch.ones(127)})
    moved = []
    to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: moved.append(1) or to(t, *a, **k))
    refused(path, r"model.safetensors: tensor 'model.norm.weight' has shape \(127,\), must "
                  r"be \(128,\)")
    assert not moved


@pytest.mark.parametrize(("change", "message"), [
    (torch.zeros(256, 128, 1), r"shape \(256, 128, 1\), must be \(256, 128\)"),
    (torch.zeros(128, 256), r"shape \(128, 256\), must be \(256, 128\)"),
    (torch.zeros(()), r"shape \(\), must be \(256, 128\)"),
    (torch.zeros(256, 128, dtype=torch.int32), "dtype I32, must be a float: F16, BF16, F32 or "
                                               "F64"),
    (torch.zeros(256, 128, dtype=torch.bool), "dtype BOOL, must be a float"),
])
def test_a_tensor_of_the_wrong_shape_or_dtype_is_named(tmp_path, change, message):
    path = make_checkpoint(tmp_path, "llama")
    edit_tensors(path, {"model.layers.1.mlp.up_proj.weight": change})
    refused(path, "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' has " + message)


@pytest.mark.parametrize("damage", [lambda data: data[:-10], lambda data: b"",
                                    lambda data: data[:5], lambda data: b"\xff" * 64])
def test_a_damaged_safetensors_file_is_named(tmp_path, damage):
    path = make_checkpoint(tmp_path, "llama")
    file = path / "model.safetensors"
    file.write_bytes(damage(file.read_bytes()))
    refused(path, "model.safetensors: not a safetensors file")


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "model.safetensors.index.json: not a JSON file"),
    ("[]", "model.safetensors.index.json: must hold a JSON object, not list"),
    ('{"metadata": {}}', "model.safetensors.index.json: no weight_map"),
    ('{"weight_map": ["a.safetensors"]}',
     r"model.safetensors.index.json: weight_map=\['a.safetensors'\]: must be a dict"),
    ('{"weight_map": {"lm_head.weight": 3}}',
     r"model.safetensors.index.json: weight_map\['lm_head.weight'\]=3: must be a plain file"),
    ('{"weight_map": {"lm_head.weight": null}}',
     r"model.safetensors.index.json: weight_map\['lm_head.weight'\]=None: must be a plain file"),
])
def test_a_malformed_index_is_named(tmp_path, text, message):
    path = sharded(tmp_path)
    (path / "model.safetensors.index.json").write_text(text)
    refused(path, message)


def test_a_folder_without_weights_says_so(tmp_path):
    path = make_checkpoint(tmp_path, "llama")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"")
    refused(path, "no model.safetensors or model.safetensors.index.json: kvlab reads "
                  "safetensors checkpoints")


@pytest.mark.parametrize("path", [None, b"/tmp", 3, "", "x" * 5000, "a\0b", ["a"],
                                  "/nonexistent/kvlab/folder", "{file}", "{tmp}"])
def test_is_checkpoint_is_false_for_odd_paths_and_load_refuses_them(tmp_path, path):
    (tmp_path / "config.json").write_text("{}")
    if isinstance(path, str):
        path = path.format(file=tmp_path / "config.json", tmp=tmp_path / "sub")
    assert checkpoint.is_checkpoint(path) is False
    for call in (lambda: checkpoint.model_config(path),
                 lambda: checkpoint.load(path, torch.float32, "cpu"),
                 lambda: checkpoint.load_weights(path, kvlab.MODELS["tiny-llama"],
                                                 torch.float32, "cpu")):
        with pytest.raises(ValueError, match="must be a checkpoint folder holding a config.json"):
            call()


@pytest.mark.parametrize(("args", "message"), [
    (("tiny-llama", torch.float32, "cpu"), "model='tiny-llama': must be a ModelConfig"),
    ((None, torch.int64, "cpu"), "dtype=torch.int64: must be a floating point torch.dtype"),
    ((None, "float32", "cpu"), "dtype='float32': must be a floating point torch.dtype"),
    ((None, torch.float32, "nodevice"), "device=.nodevice.: must be a torch device"),
    ((None, torch.float32, None), "device=None: must be a torch device"),
])
def test_load_weights_checks_its_other_arguments(tmp_path, args, message):
    path = make_checkpoint(tmp_path, "llama")
    model = checkpoint.model_config(path)
    args = (args[0] or model, *args[1:])
    with pytest.raises(ValueError, match=message):
        checkpoint.load_weights(path, *args)


def test_sizes_whose_weights_no_machine_holds_are_refused(tmp_path):
    """Each size is within int32, the embedding [2**31 - 1, 2**30] is not: 2**63 bytes."""
    path = make_checkpoint(tmp_path, "llama")
    edit_config(path, vocab_size=2**31 - 1, hidden_size=2**30, num_attention_heads=2**24,
                num_key_value_heads=2**24, head_dim=DROP)
    assert checkpoint.model_config(path).vocab_size == 2**31 - 1
    refused(path, "llama: llama's weights are too large")
