"""A decoder layer's work around its attention: `layer_head` (the attention norm, then Q, K and V
of the new tokens) and `layer_tail` (W_O, the residuals, the MLP norm and the MLP), which the
engine's passes and the KVPR runtime run around attentions of their own; and `decode_layer`, one
layer of a decode step whole.

Layer (pre-norm, both families):
    x = attention_norm(h);  h = h + W_O attention(Q(x), K, V) (+ b_O)
    h = h + MLP(mlp_norm(h))
OPT: LayerNorm, MLP = fc2(relu(fc1 .)) with biases, out_proj bias. Llama / Qwen2: RMSNorm,
MLP = down(silu(gate .) * up .), no MLP biases. Tensors of a batch are [batch, ...]; a layer's
K, V are [tokens, batch, num_kv_heads, head_dim] (the KVPR host store's token-major layout).
With `fused` (`kvlab.model.weights.fuse`), Q, K and V come from one GEMM, and gate and up from
another.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvlab.config import ModelConfig
from kvlab.kernels import layer_ops
from kvlab.model.attention import attend, attention_input, project_kv, project_q
from kvlab.model.norm import add_norm
from kvlab.model.rope import RopeTable, rotate
from kvlab.model.weights import Fused, LayerWeights


def layer_head(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor,
               positions: torch.Tensor, rope: RopeTable | None = None,
               fused: Fused | None = None) -> tuple:
    """A layer's decode work before the attention: (X, Q, K, V) of the batch's new tokens at
    `positions` [batch]. X [batch, hidden_size] is the attention input KVPR stores; Q [batch,
    num_qo_heads, head_dim]; K, V [batch, num_kv_heads, head_dim] (views into one GEMM's output
    with `fused`, w's stacks)."""
    if fused is None:
        x = attention_input(model, w.attn, hidden)
        k, v = project_kv(model, w.attn, x, positions, rope)
        return x, project_q(model, w.attn, x, positions, rope), k, v
    x, qkv = project_qkv(model, w, hidden, fused)
    return x, *qkv_heads(model, qkv, positions, rope)


def project_qkv(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor, fused: Fused
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention input X [batch, hidden_size] of hidden, and its Q, K, V projections in one
    GEMM: [batch, q_size + 2 kv_size] (before RoPE)."""
    x = attention_input(model, w.attn, hidden)
    return x, linear(x, fused.qkv, fused.b_qkv)


def qkv_heads(model: ModelConfig, qkv: torch.Tensor, positions: torch.Tensor,
              rope: RopeTable | None = None) -> tuple:
    """Q (contiguous), K, V of `project_qkv`'s output at `positions`, as `layer_head` returns
    them."""
    q, k, v = (t.view(-1, t.shape[1] // model.head_dim, model.head_dim) for t in
               qkv.split([model.q_size, model.kv_size, model.kv_size], dim=1))
    # Q contiguous, as the decode kernels take it (RoPE's output is; OPT's view is not)
    q = rotate(model, q, positions, rope).contiguous()
    return q, rotate(model, k, positions, rope), v


def layer_tail(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor,
               attn: torch.Tensor, fused: Fused | None = None,
               reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """A layer's decode work after the attention: W_O, the residual, the MLP norm and the MLP
    (gate and up by one GEMM with `fused`, w's stacks). attn [batch, num_qo_heads * head_dim]
    -> the layer's output [batch, hidden_size]. reduce: with tensor parallelism
    (`kvlab.engine.tp`), the sum over the ranks of W_O's and W_down's partial outputs."""
    o = linear(attn, w.attn.w_o, w.b_o)
    hidden, y = add_norm(model, hidden, o if reduce is None else reduce(o), w.mlp_norm_weight,
                         w.mlp_norm_bias)
    if w.w_gate is None:
        y = F.relu(linear(y, w.w_up, w.b_up))
    elif fused is None:
        y = F.silu(linear(y, w.w_gate)) * linear(y, w.w_up)
    else:
        y = linear(y, fused.gate_up, swiglu=True)
    if reduce is None:
        return linear(y, w.w_down, w.b_down, residual=hidden)
    return hidden + reduce(linear(y, w.w_down, w.b_down))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, swiglu: bool = False) -> torch.Tensor:
    """F.linear, then residual + its output, or with `swiglu` SwiGLU's product of its halves
    (weight stacks W_gate over W_up): one `layer_ops.linear` kernel where it takes the tensors,
    a decode step of at most layer_ops.LINEAR_ROWS rows on a GPU."""
    if x.is_cuda and layer_ops.linear_problem(x, weight, bias, residual, swiglu) is None:
        return layer_ops.linear(x, weight, bias, residual=residual, swiglu=swiglu)
    y = F.linear(x, weight, bias)
    if swiglu:
        return silu_mul(y)
    return y if residual is None else residual + y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [batch, 2 intermediate] (gate, then up in each row): one
    kernel on a GPU."""
    if layer_ops.usable(gate_up) and gate_up.is_contiguous():
        return layer_ops.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def decode_layer(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor, position: int,
                 k: torch.Tensor, v: torch.Tensor, rope: RopeTable | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer of a decode step for a batch whose sequences all have `position` cached tokens.

    hidden: [batch, hidden_size]. k, v: [>= position + 1, batch, num_kv_heads, head_dim] holding
    the cached K, V in [0:position]; the new token's K, V are written at [position]. rope: a
    table covering `position` (RoPE families), or None to compute cos and sin here.
    Returns (the layer's output hidden [batch, hidden_size], the new token's attention input X
    [batch, hidden_size]) - X, k[position], v[position] are what goes back to the host.
    """
    batch = hidden.shape[0]
    positions = torch.full((batch,), position, dtype=torch.long, device=hidden.device)
    x, q, k[position], v[position] = layer_head(model, w, hidden, positions, rope)
    attn = attend(model, q, k[:position + 1], v[:position + 1]).reshape(batch, model.q_size)
    return layer_tail(model, w, hidden, attn), x
