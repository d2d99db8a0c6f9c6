"""Tensor parallelism for `kvlab.LLM` over torch.distributed, one process per device.

Each of `world` ranks holds a shard of every layer, cut as Megatron-LM cuts it:
- attention: rank r owns query heads [r nq / world, (r + 1) nq / world) and KV heads [r nkv /
  world, (r + 1) nkv / world), so a GQA group never straddles two ranks: the rows of W_Q, W_K,
  W_V (and their biases) of those heads, the matching columns of W_O, and the K, V cache of its
  KV heads alone;
- MLP: the rows [r ffn / world, (r + 1) ffn / world) of W_gate and W_up (and OPT's fc1 bias), the
  matching columns of W_down;
- the output biases of W_O and W_down live on rank 0 (zeros elsewhere), so that the sum of the
  ranks' partial outputs adds them once;
- the embeddings, the norms and the LM head are whole on every rank.
After W_O and after W_down the ranks sum their partial outputs (`all_reduce`); every rank then
holds the same hidden states, the same logits and, with the same seed, samples the same tokens,
so each runs the same scheduler on its own shard of the cache.
"""

from __future__ import annotations

import dataclasses

import torch

from kvlab.config import ModelConfig
from kvlab.engine.weights import ModelWeights


def shard_config(model: ModelConfig, world: int) -> ModelConfig:
    """The shape one rank of `world` computes: its heads and MLP columns. Raises ValueError
    unless the KV heads (and so the query heads, a multiple of them) and the MLP width divide
    by `world`."""
    for name in ("num_kv_heads", "intermediate_size"):
        if getattr(model, name) % world:
            raise ValueError(f"tensor parallel over {world} ranks: {model.name}'s {name}="
                             f"{getattr(model, name)} does not divide by {world}")
    return dataclasses.replace(model, num_qo_heads=model.num_qo_heads // world,
                               num_kv_heads=model.num_kv_heads // world,
                               intermediate_size=model.intermediate_size // world)


def shard_weights(model: ModelConfig, w: ModelWeights, rank: int, world: int) -> ModelWeights:
    """Rank `rank`'s shard of the whole model's weights `w`: copies of the cut tensors, so that
    the whole ones may be freed; what every rank holds whole (embeddings, norms, LM head) is
    shared with `w`."""
    local = shard_config(model, world)

    def rows(t, size):
        return None if t is None else t[rank * size:(rank + 1) * size].clone()

    def cols(t, size):
        return t[:, rank * size:(rank + 1) * size].contiguous()

    def once(t):
        return t if t is None or rank == 0 else torch.zeros_like(t)

    layers = []
    for layer in w.layers:
        a = layer.attn
        attn = dataclasses.replace(
            a, w_q=rows(a.w_q, local.q_size), w_k=rows(a.w_k, local.kv_size),
            w_v=rows(a.w_v, local.kv_size), w_o=cols(a.w_o, local.q_size),
            b_q=rows(a.b_q, local.q_size), b_k=rows(a.b_k, local.kv_size),
            b_v=rows(a.b_v, local.kv_size))
        ffn = local.intermediate_size
        layers.append(dataclasses.replace(
            layer, attn=attn, b_o=once(layer.b_o), w_gate=rows(layer.w_gate, ffn),
            w_up=rows(layer.w_up, ffn), b_up=rows(layer.b_up, ffn),
            w_down=cols(layer.w_down, ffn), b_down=once(layer.b_down)))
    tied = w.lm_head is w.embed
    return ModelWeights(embed=w.embed, positions=w.positions, layers=layers,
                        norm_weight=w.norm_weight, norm_bias=w.norm_bias,
                        lm_head=w.embed if tied else w.lm_head)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `t`, in place (the default process group)."""
    torch.distributed.all_reduce(t)
    return t
