"""Local Hugging Face checkpoints (config.json + safetensors) run in kvlab.LLM with HF's logits
and greedy tokens: Llama with Llama 3 rope scaling and its own norm epsilon, Qwen2 with tied
embeddings, OPT, sharded checkpoints; configs kvlab cannot run are refused by name (CPU)."""

import dataclasses
import json

import pytest
import torch

import kvlab
from kvlab.config import RopeScaling
from kvlab.engine import checkpoint, forward
from kvlab.model.rope import RopeTable

transformers = pytest.importorskip("transformers")

VOCAB = 300
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=1024, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=384, intermediate_size=512, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=512,
        tie_word_embeddings=True),
    "opt": lambda: transformers.OPTConfig(
        hidden_size=256, ffn_dim=512, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, max_position_embeddings=512, word_embed_proj_dim=256,
        do_layer_norm_before=True),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "opt": "OPTForCausalLM"}


def saved(tmp_path, kind: str, **save):
    torch.manual_seed(0)
    hf = getattr(transformers, CLASSES[kind])(CONFIGS[kind]()).eval()
    path = tmp_path / kind
    hf.save_pretrained(path, **save)
    return hf, path


def prompt(n: int = 100) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1)).tolist()


def last_logits(llm, ids, model=None):
    alloc = llm.manager.add_sequence(len(ids), ids)
    try:
        return forward.prefill(model or llm.model, llm.weights, llm.caches, [alloc],
                               [torch.tensor(ids)], llm.rope)[0]
    finally:
        llm.manager.free(alloc.seq_id)


@pytest.mark.parametrize("kind", CONFIGS)
def test_a_checkpoint_gives_hf_logits_and_greedy_tokens(tmp_path, kind):
    hf, path = saved(tmp_path, kind)
    llm = kvlab.LLM(str(path), device="cpu", num_blocks=64)
    assert llm.model.family == kind and llm.model.name == kind
    ids = prompt()
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([ids])).logits[0, -1]
        hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
        greedy = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
    torch.testing.assert_close(last_logits(llm, ids), expected, rtol=1e-4, atol=1e-4)
    assert llm.generate(ids, max_new_tokens=32).tokens == [greedy[0, len(ids):].tolist()]


def test_llama3_rope_scaling_and_norm_eps_are_read_and_matter(tmp_path):
    _, path = saved(tmp_path, "llama")
    llm = kvlab.LLM(path, device="cpu", num_blocks=64)
    m = llm.model
    assert m.norm_eps == 1e-5 and m.rope_theta == 500000.0
    assert m.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 64)
    plain = dataclasses.replace(m, rope_scaling=None)
    llm.rope = RopeTable.build(plain, plain.max_position, torch.float32, "cpu")
    scaled = kvlab.LLM(path, device="cpu", num_blocks=64)
    ids = prompt()
    assert (last_logits(llm, ids, plain) - last_logits(scaled, ids)).abs().max() > 1e-3


def test_a_sharded_checkpoint_loads_every_shard(tmp_path):
    hf, path = saved(tmp_path, "qwen2", max_shard_size="500KB")
    assert (path / "model.safetensors.index.json").is_file()
    llm = kvlab.LLM(path, device="cpu", num_blocks=64)
    ids = prompt(20)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(last_logits(llm, ids), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("kind", "edit", "message"), [
    ("llama", {"model_type": "gpt2"}, "model_type='gpt2' in config.json; kvlab runs llama"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu' in config.json"),
    ("llama", {"attention_bias": True}, "attention_bias=True in config.json"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "rope_type='yarn'"),
    ("opt", {"do_layer_norm_before": False}, "do_layer_norm_before=False in config.json"),
    ("opt", {"word_embed_proj_dim": 128}, "word_embed_proj_dim=128 in config.json"),
])
def test_configs_kvlab_cannot_run_are_refused_by_name(tmp_path, kind, edit, message):
    _, path = saved(tmp_path, kind)
    config = json.loads((path / "config.json").read_text())
    if "rope_scaling" in edit:  # transformers 5 writes them as rope_parameters, read first
        config.pop("rope_parameters", None)
    (path / "config.json").write_text(json.dumps({**config, **edit}))
    with pytest.raises(ValueError, match=message.replace("(", "\\(")):
        kvlab.LLM(path, device="cpu", num_blocks=8)


def test_missing_weights_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    _, path = saved(tmp_path, "llama")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match="no tensor 'model.layers.1.mlp.up_proj.weight'"):
        kvlab.LLM(path, device="cpu", num_blocks=8)
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        kvlab.LLM(path, device="cpu", num_blocks=8)
    assert checkpoint.is_checkpoint(path) and not checkpoint.is_checkpoint(tmp_path)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_memory_check_counts_a_tied_lm_head_once(tmp_path, kind, monkeypatch):
    """A tied checkpoint's embedding is its LM head: counting both refused caches that fit."""
    from kvlab.engine import runner

    _, path = saved(tmp_path, kind)
    checked = []
    monkeypatch.setattr(runner, "check_fits", lambda what, nbytes, device: checked.append(nbytes))
    llm = kvlab.LLM(str(path), device="cpu", num_blocks=8)
    assert (llm.weights.lm_head is llm.weights.embed) == (kind == "qwen2")
    cache = sum(c.k_cache.nbytes + c.v_cache.nbytes for c in llm.caches)
    assert checked == [llm.weights.nbytes + cache]
