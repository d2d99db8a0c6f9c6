"""K, V recomputed from stored activations equal those written token by token, and KVPR's joined
cache gives the attention output of the resident one, at every split, for OPT, Llama and Qwen2."""

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.attention import attention_input, project_kv, project_q
from kvlab.model.rope import RopeTable
from kvlab.model.weights import AttentionWeights
from kvlab.offload.recompute import recompute_kv

FAMILIES = ["tiny-opt", "tiny-llama", "tiny-qwen"]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def decode_history(model, w, num_tokens, dtype, seed=0):
    """What a decoder leaves behind: each token's stored activation and its K, V, computed one
    token at a time at its position, as decoding writes them."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_tokens, model.hidden_size, generator=gen).to(dtype)
    x = attention_input(model, w, hidden)
    ks, vs = zip(*(project_kv(model, w, x[t:t + 1], torch.tensor([t])) for t in range(num_tokens)),
                 strict=True)
    return x, torch.cat(ks), torch.cat(vs)


def attend(model, q, k, v):
    """Decode attention of one query token over k, v [tokens, kv heads, d] (GQA by repeat)."""
    group = model.gqa_group
    k, v = (t.repeat_interleave(group, dim=1).transpose(0, 1).float() for t in (k, v))
    scores = (q.float()[:, None, :] @ k.transpose(1, 2)) / model.head_dim ** 0.5  # [heads, 1, T]
    return (scores.softmax(-1) @ v)[:, 0, :]


def kvpr_kv(model, w, x, k_host, v_host, l):
    """KVPR's layer K, V: [0:l] recomputed from the activations, [l:] copied."""
    k_new, v_new = project_kv(model, w, x[:l], torch.arange(l))
    return torch.cat([k_new, k_host[l:]]), torch.cat([v_new, v_host[l:]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FAMILIES)
def test_kvpr_attention_equals_resident_at_every_split(name, dtype):
    model = MODELS[name]
    w = AttentionWeights.random(model, seed=1, dtype=dtype)
    x, k_host, v_host = decode_history(model, w, 37, dtype)
    q = project_q(model, w, x[-1:], torch.tensor([37]))[0]
    resident = attend(model, q, k_host, v_host)
    for l in range(38):
        k, v = kvpr_kv(model, w, x, k_host, v_host, l)
        assert (k - k_host).abs().max().item() <= TOLERANCE[dtype] * k_host.abs().max().item()
        got = attend(model, q, k, v)
        assert torch.allclose(got, resident, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype]), l


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen"])
def test_a_recompute_at_the_wrong_positions_is_caught(name):
    model = MODELS[name]
    w = AttentionWeights.random(model, seed=1)
    x, k_host, _ = decode_history(model, w, 9, torch.float32)
    k_shifted, _ = project_kv(model, w, x, torch.arange(1, 10))
    assert not torch.allclose(k_shifted, k_host, atol=1e-3)


@pytest.mark.parametrize("name", FAMILIES)
def test_recompute_kv_writes_what_project_kv_computes(name):
    """The runtime's in-place recompute of tokens [5, 9) of a batch of 3, token-major, equals
    project_kv of each sequence's tokens at their positions, and leaves the rest untouched."""
    model = MODELS[name]
    w = AttentionWeights.random(model, seed=4)
    rope = RopeTable.build(model, 16, torch.float32, "cpu") if model.position == "rope" else None
    x = torch.randn(4, 3, model.hidden_size, generator=torch.Generator().manual_seed(5))
    k = torch.full((16, 3, model.num_kv_heads, model.head_dim), 7.0)
    v = k.clone()
    recompute_kv(model, w, x, k[5:9], v[5:9], 5, rope)
    for b in range(3):
        k_ref, v_ref = project_kv(model, w, x[:, b], torch.arange(5, 9))
        torch.testing.assert_close(k[5:9, b], k_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v[5:9, b], v_ref, rtol=1e-5, atol=1e-5)
    assert (k[:5] == 7).all() and (k[9:] == 7).all() and (v[:5] == 7).all()


def test_recompute_kv_refuses_bad_input():
    model = MODELS["tiny-llama"]
    w = AttentionWeights.random(model, seed=0)
    k = torch.empty(2, 1, model.num_kv_heads, model.head_dim)
    with pytest.raises(ValueError, match=r"x.shape=\(2, 256\): must be \[tokens, batch, 256\]"):
        recompute_kv(model, w, torch.zeros(2, 256), k, k.clone(), 0, None)
    with pytest.raises(ValueError, match=r"v.shape=\(2, 2, 2, 64\): must be \(2, 1, 2, 64\)"):
        recompute_kv(model, w, torch.zeros(2, 1, 256), k, torch.empty(2, 2, 2, 64), 0, None)
    with pytest.raises(ValueError, match="rope=None: tiny-llama needs a RopeTable"):
        recompute_kv(model, w, torch.zeros(2, 1, 256), k, k.clone(), 0, None)
