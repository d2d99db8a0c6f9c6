"""A decoder layer's attention, as each model family computes it: its input X (the attention norm
of the layer input: LayerNorm for OPT, RMSNorm for Llama and Qwen2), the projections

    Q = X W_Q^T (+ b_Q),  K = X W_K^T (+ b_K),  V = X W_V^T (+ b_V),

with RoPE turning Q and K at each token's absolute position in its sequence in the RoPE families
(OPT adds its learned positions to the embeddings before the first layer: nothing positional
happens here), and decode attention of the new tokens' Q over the cached K, V.

Shapes: x [tokens, hidden_size]; q [tokens, num_qo_heads, head_dim]; k, v [tokens, num_kv_heads,
head_dim]; positions [tokens] int. The same code runs on the CPU (tests) and the GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kvlab.config import ModelConfig
from kvlab.model.norm import norm
from kvlab.model.rope import RopeTable, rotate
from kvlab.model.weights import AttentionWeights


def attention_input(model: ModelConfig, w: AttentionWeights, hidden: torch.Tensor, *,
                    ahead: torch.Tensor | None = None, ahead_bytes: int = 0) -> torch.Tensor:
    """The attention norm of the layer input: what KVPR stores per token. ahead, ahead_bytes:
    `norm`'s cross-kernel prefetch (of the QKV weight)."""
    return norm(model, hidden, w.norm_weight, w.norm_bias, ahead=ahead, ahead_bytes=ahead_bytes)


def project_q(model: ModelConfig, w: AttentionWeights, x: torch.Tensor,
              positions: torch.Tensor, rope: RopeTable | None = None) -> torch.Tensor:
    """Q [tokens, num_qo_heads, head_dim] of the tokens (RoPE applied where the family has it)."""
    q = F.linear(x, w.w_q, w.b_q).view(-1, model.num_qo_heads, model.head_dim)
    return rotate(model, q, positions, rope)


def project_kv(model: ModelConfig, w: AttentionWeights, x: torch.Tensor,
               positions: torch.Tensor, rope: RopeTable | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V [tokens, num_kv_heads, head_dim] of tokens with attention inputs `x` at `positions`
    (`rope`: a precomputed table covering them, else cos and sin are computed here)."""
    if x.dim() != 2 or x.shape[1] != model.hidden_size:
        raise ValueError(f"x.shape={tuple(x.shape)}: must be [tokens, {model.hidden_size}]")
    if positions.shape != (x.shape[0],):
        raise ValueError(f"positions.shape={tuple(positions.shape)}: must be ({x.shape[0]},)")
    shape = (-1, model.num_kv_heads, model.head_dim)
    k = F.linear(x, w.w_k, w.b_k).view(shape)
    v = F.linear(x, w.w_v, w.b_v).view(shape)
    return rotate(model, k, positions, rope), v


# NOTE: not cuDNN's SDPA: it builds a plan on its first call at each new sequence length, and a
# decode loop meets a new length every step, so every step would pay that first call.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(model: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Decode attention: q [batch, num_qo_heads, d] over k, v [tokens, batch, num_kv_heads, d]."""
    k, v = (t.permute(1, 2, 0, 3) for t in (k, v))  # [batch, heads, tokens, d]
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v,
                                             enable_gqa=model.num_kv_heads != model.num_qo_heads)
    return out[:, :, 0, :]
