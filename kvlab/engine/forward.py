"""A decoder's forward passes: the prefill of a batch of prompts (`run_prompts`, which hands each
layer's X, K, V to the caller; `prefill` writes them into the paged cache) and one decode step of
a batch over the paged cache. The layer math is `kvlab.model`'s (the KVPR runtime's too); the
attention of a decode step is passed in, so that the same pass runs kvlab's CUDA kernels or the
reference.

Caches: one `PagedKVCache` per layer, all sharing one BlockManager. The caller places a
sequence's tokens with the manager (one Allocation for all layers) and these passes write each
layer's K, V into them with `PagedKVCache.write`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from kvlab.cache import Allocation
from kvlab.config import ModelConfig
from kvlab.engine.weights import OPT_POSITION_OFFSET, ModelWeights
from kvlab.kernels import layer_ops
from kvlab.model.attention import SDPA_BACKENDS
from kvlab.model.layer import (
    Ahead,
    KvAhead,
    folded_norm,
    layer_head,
    layer_tail,
    linear,
    prefetch_args,
    qkv_heads,
    qkv_input,
    qkv_prefetch,
)
from kvlab.model.norm import norm
from kvlab.model.rope import RopeTable
from kvlab.model.weights import Fused, LayerWeights

# attend(layer index, q [batch, num_qo_heads, head_dim]) -> [batch, num_qo_heads, head_dim]
Attend = Callable[[int, torch.Tensor], torch.Tensor]
# reduce(partial output): with tensor parallelism, the sum over the ranks (kvlab.engine.tp)
Reduce = Callable[[torch.Tensor], torch.Tensor]
# keep(layer index, X [T, hidden_size], K, V [T, num_kv_heads, head_dim]): where a prefill puts
# each layer's attention inputs and K, V of its T prompt tokens (the prompts one after another)
Keep = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def embed(model: ModelConfig, w: ModelWeights, token_ids: torch.Tensor,
          positions: torch.Tensor) -> torch.Tensor:
    """Hidden states [n, hidden_size] of tokens `token_ids` [n] at `positions` [n]."""
    hidden = F.embedding(token_ids, w.embed)
    if w.positions is not None:
        hidden = hidden + F.embedding(positions + OPT_POSITION_OFFSET, w.positions)
    return hidden


def logits(model: ModelConfig, w: ModelWeights, hidden: torch.Tensor,
           ahead_bytes: int = 0) -> torch.Tensor:
    """Logits [n, vocab_size] of the last layer's hidden states [n, hidden_size], in the weights'
    dtype (as HF's models return them): greedy sampling takes their argmax as they are, and
    only sampling at a temperature converts them to fp32. ahead_bytes: above
    layer_ops.LINEAR_ROWS rows the final norm brings the LM head's first bytes into L2
    (kvlab.model.layer.Ahead; up to it the last layer's W_down does, and the LM head's linear
    folds the norm in: `folded_norm`)."""
    if (final := folded_norm(model, w.norm_weight, hidden, w.lm_head)) is not None:
        return layer_ops.linear(hidden, w.lm_head, norm=final)
    ahead = prefetch_args(ahead_bytes, w.lm_head, gemm_rows=hidden)
    return linear(norm(model, hidden, w.norm_weight, w.norm_bias, **ahead), w.lm_head)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal self-attention of one sequence: q [n, num_qo_heads, d], k, v [n, num_kv_heads, d]
    -> [n, num_qo_heads * d]."""
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, n, d]
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1).reshape(q.shape[2], -1)


@torch.no_grad()
def run_prompts(model: ModelConfig, w: ModelWeights, prompts: Sequence[torch.Tensor],
                rope: RopeTable | None, keep: Keep, reduce: Reduce | None = None) -> torch.Tensor:
    """Run whole prompts through the model together, prompt i's token ids [n_i] at positions
    0..n_i-1: the projections and the MLP on all the prompts' tokens at once, attention causal
    within each prompt, each layer's X, K, V handed to `keep`. Returns the logits
    [len(prompts), vocab_size] of each prompt's last token."""
    lens = [p.shape[0] for p in prompts]
    token_ids = torch.cat(list(prompts))
    positions = torch.cat([torch.arange(n, device=token_ids.device) for n in lens])
    hidden = embed(model, w, token_ids, positions)
    for i, (layer, fused) in enumerate(zip(w.layers, w.fused, strict=True)):
        x, q, k, v = layer_head(model, layer, hidden, positions, rope, fused)
        keep(i, x, k, v)
        out = torch.cat([causal_attention(*t) for t in zip(q.split(lens), k.split(lens),
                                                           v.split(lens), strict=True)])
        hidden = layer_tail(model, layer, hidden, out, fused, reduce)
    last = torch.tensor(lens, device=token_ids.device).cumsum(0) - 1
    return logits(model, w, hidden[last])


def prefill(model: ModelConfig, w: ModelWeights, caches: Sequence,
            allocs: Sequence[Allocation], prompts: Sequence[torch.Tensor],
            rope: RopeTable | None, reduce: Reduce | None = None) -> torch.Tensor:
    """`run_prompts` into paged caches: prompt i's K, V of each layer go into that layer's cache
    at allocs[i] (the manager's placement of its n_i tokens; blocks of a shared prefix are not
    rewritten). Returns the logits [len(prompts), vocab_size] of each prompt's last token."""
    lens = [p.shape[0] for p in prompts]

    def keep(i, x, k, v):
        for alloc, ki, vi in zip(allocs, k.split(lens), v.split(lens), strict=True):
            caches[i].write(alloc, ki, vi)

    return run_prompts(model, w, prompts, rope, keep, reduce)


@torch.no_grad()
def decode_step(model: ModelConfig, w: ModelWeights, caches: Sequence,
                copies: Sequence[tuple[int, int]], slots: torch.Tensor, token_ids: torch.Tensor,
                positions: torch.Tensor, attend: Attend, rope: RopeTable | None,
                reduce: Reduce | None = None, ahead_bytes: int = 0,
                kv_ahead: KvAhead | None = None) -> torch.Tensor:
    """One decode step of a batch: token_ids [batch] at `positions` [batch], one per sequence,
    already placed by the manager: `slots` [batch] (int64, on the caches' device) are their
    cache slots, `copies` the copy-on-write block copies their placement asked for. Each layer
    writes the new tokens' K, V (one scatter), then attends over the whole cached sequences
    with `attend`. ahead_bytes: the cross-kernel L2 prefetch (kvlab.model.layer.Ahead): the
    kernels before each GEMM bring as many of its weight's first bytes into L2 (0: off).
    kv_ahead: each layer's QKV linear brings the layer's K and V blocks into L2 for its attention
    (None: off). Returns the logits [batch, vocab_size]."""
    # each layer's K/V prefetch, checked before the step's first launch
    kvs = [None if kv_ahead is None else kv_ahead.of(cache) for cache in caches]
    hidden = embed(model, w, token_ids, positions)
    batch = token_ids.shape[0]
    firsts = [fused.qkv for fused in w.fused[1:]] + [w.lm_head]  # what follows each layer
    for i, (layer, fused, cache) in enumerate(zip(w.layers, w.fused, caches, strict=True)):
        ahead = (Ahead(ahead_bytes, firsts[i], kvs[i])
                 if ahead_bytes or kv_ahead is not None else None)
        cache.copy_blocks(copies)
        q = query_and_write(model, layer, fused, cache, slots, hidden, positions, rope, ahead)
        out = attend(i, q).reshape(batch, model.q_size).to(hidden.dtype)
        hidden = layer_tail(model, layer, hidden, out, fused, reduce, ahead)
    return logits(model, w, hidden, ahead_bytes)


def query_and_write(model: ModelConfig, layer: LayerWeights, fused: Fused, cache,
                    slots: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                    rope: RopeTable | None, ahead: Ahead | None = None) -> torch.Tensor:
    """A decode step's `layer_head` into attention: the new tokens' K, V written into `cache`
    at `slots`, their Q [batch, num_qo_heads, head_dim] returned. On a GPU, where the family
    rotates and the cache holds fp16 or bf16, the attention norm, the QKV linear, RoPE and the
    write are one kernel (layer_ops.linear_rope_write) where `folded_norm` says so (at most
    LINEAR_ROWS rows), and RoPE with the write one kernel after the norm and the GEMM above
    that (here, not in the cache: kvlab.cache sits below the kernels that read it)."""
    rotates = (model.position == "rope" and rope is not None
               and layer_ops.same_kind(hidden, rope.cos, cache.k_cache))
    if rotates and (attn_norm := folded_norm(model, layer.attn.norm_weight, hidden, fused.qkv,
                                             bias=fused.b_qkv)) is not None:
        return layer_ops.linear_rope_write(hidden, attn_norm, fused.qkv, fused.b_qkv,
                                           model.num_qo_heads, rope.cos, rope.sin, positions,
                                           cache, slots, **qkv_prefetch(layer, ahead))
    x = qkv_input(model, layer, hidden, fused, ahead)
    qkv = linear(x, fused.qkv, fused.b_qkv, **qkv_prefetch(layer, ahead))
    if rotates:
        return layer_ops.rope_write(qkv, model.num_qo_heads, rope.cos, rope.sin, positions,
                                    cache, slots)
    q, k, v = qkv_heads(model, qkv, positions, rope)
    if layer_ops.usable(k, cache.k_cache):
        layer_ops.write_kv(cache, slots, k, v)
    else:
        cache.write_slots(slots, k, v)
    return q
