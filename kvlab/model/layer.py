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
another. With `ahead` (an `Ahead`), each linear brings the first bytes of the next one's weight
into L2 as it drains, and the QKV linear the layer's K and V blocks (the cross-kernel prefetch of
`layer_ops.linear`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab.config import ModelConfig
from kvlab.kernels import layer_ops
from kvlab.model.attention import attend, attention_input, project_kv, project_q
from kvlab.model.norm import add_norm
from kvlab.model.rope import RopeTable, rotate
from kvlab.model.weights import Fused, LayerWeights


@dataclass(frozen=True)
class Ahead:
    """The cross-kernel L2 prefetch of a decode step: the first `nbytes` of each GEMM's weight
    brought into L2 by kvlab kernels that run before it (`layer_ops`' `ahead`):
    - at steps of at most layer_ops.LINEAR_ROWS rows, each linear of layer_ops, as its grid
      drains, the next linear's: QKV -> W_O -> gate and up -> W_down -> `after` (the next
      layer's QKV, or the LM head);
    - at larger steps (cuBLAS's GEMMs), the RMSNorm kernels as they start, the GEMM after them
      (the attention norm QKV's, the MLP norm gate and up's, the final norm the LM head's), and
      SwiGLU's product kernel W_down's. W_O's has none: the attention kernel runs before it.
    kv: the layer's K and V blocks, which its QKV linear (at most layer_ops.LINEAR_ROWS rows)
    brings into L2 as it drains, for the attention after it; None: not these.
    A hint: torch's ops run without it, a weight the kernels cannot prefetch (`prefetch_args`)
    is left out, and nothing computed changes."""

    nbytes: int
    after: torch.Tensor
    kv: layer_ops.PagedAhead | None = None


@dataclass(frozen=True)
class KvAhead:
    """A decode step's prefetch of each layer's K and V blocks (`Ahead.kv`): at most `nbytes` a
    layer, the blocks of the step's `block_tables` (int32 [rows, cols]) and `seq_lens` (int32
    [rows]) on the GPU, as the step's attention plan reads them."""

    nbytes: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor

    def of(self, cache) -> layer_ops.PagedAhead:
        """The prefetch of one layer's blocks, from its paged cache (kvlab.cache.PagedKVCache).
        Raises ValueError for what `layer_ops.linear` would refuse (paged_ahead_problem)."""
        kv = layer_ops.PagedAhead(cache.k_cache, cache.v_cache, self.block_tables,
                                  self.seq_lens, cache.block_size, self.nbytes)
        if (problem := layer_ops.paged_ahead_problem(kv, cache.k_cache.device)) is not None:
            raise ValueError(problem)
        return kv


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


def project_qkv(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor, fused: Fused,
                ahead: Ahead | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention input X [batch, hidden_size] of hidden (`qkv_input`), and its Q, K, V
    projections in one GEMM: [batch, q_size + 2 kv_size] (before RoPE), with `qkv_prefetch`'s
    prefetch."""
    x = qkv_input(model, w, hidden, fused, ahead)
    return x, linear(x, fused.qkv, fused.b_qkv, **qkv_prefetch(w, ahead))


def qkv_input(model: ModelConfig, w: LayerWeights, hidden: torch.Tensor, fused: Fused,
              ahead: Ahead | None = None) -> torch.Tensor:
    """The attention input X [batch, hidden_size] of hidden, which the fused QKV GEMM takes; with
    `ahead`, its norm brings that GEMM's first weight bytes into L2 (at cuBLAS's batches)."""
    return attention_input(model, w.attn, hidden, **_ahead(ahead, fused.qkv, gemm_rows=hidden))


def qkv_prefetch(w: LayerWeights, ahead: Ahead | None) -> dict:
    """The fused QKV linear's prefetch arguments under `ahead`: W_O's first bytes, and ahead.kv's
    K/V blocks."""
    kv = {} if ahead is None or ahead.kv is None else {"kv_ahead": ahead.kv}
    return {**_ahead(ahead, w.attn.w_o), **kv}


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
               reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
               ahead: Ahead | None = None) -> torch.Tensor:
    """A layer's decode work after the attention: W_O, the residual, the MLP norm and the MLP
    (gate and up by one GEMM with `fused`, w's stacks). attn [batch, num_qo_heads * head_dim]
    -> the layer's output [batch, hidden_size]. reduce: with tensor parallelism
    (`kvlab.engine.tp`), the sum over the ranks of W_O's and W_down's partial outputs. ahead:
    each linear prefetches the next one's first bytes, W_down ahead.after's. Where layer_ops'
    linear takes the step (`folded_norm`: RMSNorm, at most LINEAR_ROWS rows on a GPU), with
    `fused` and without `reduce`, W_O's linear adds the residual and gate and up's folds in the
    MLP norm: two launches where add_norm and the linear after it take three."""
    gate_up = w.w_up if w.w_gate is None else w.w_gate if fused is None else fused.gate_up
    after = _ahead(ahead, None if ahead is None else ahead.after)
    norm = (folded_norm(model, w.mlp_norm_weight, hidden, gate_up, swiglu=True)
            if fused is not None and reduce is None else None)
    if (norm is not None
            and layer_ops.linear_problem(attn, w.attn.w_o, w.b_o, residual=hidden) is None):
        # W_O with the residual, then the MLP norm inside gate and up's linear
        hidden = layer_ops.linear(attn, w.attn.w_o, w.b_o, residual=hidden,
                                  **_ahead(ahead, gate_up))
        y = layer_ops.linear(hidden, gate_up, swiglu=True, norm=norm, **_ahead(ahead, w.w_down))
        return linear(y, w.w_down, w.b_down, residual=hidden, **after)
    o = linear(attn, w.attn.w_o, w.b_o, **_ahead(ahead, gate_up))
    hidden, y = add_norm(model, hidden, o if reduce is None else reduce(o), w.mlp_norm_weight,
                         w.mlp_norm_bias, **_ahead(ahead, gate_up, gemm_rows=hidden))
    if w.w_gate is None:
        y = F.relu(linear(y, w.w_up, w.b_up, **_ahead(ahead, w.w_down)))
    elif fused is None:
        y = F.silu(linear(y, w.w_gate, **_ahead(ahead, w.w_up))) * linear(
            y, w.w_up, **_ahead(ahead, w.w_down))
    else:
        y = linear(y, fused.gate_up, swiglu=True, **_ahead(ahead, w.w_down))
    if reduce is None:
        return linear(y, w.w_down, w.b_down, residual=hidden, **after)
    return hidden + reduce(linear(y, w.w_down, w.b_down, **after))


def folded_norm(model: ModelConfig, weight: torch.Tensor, x: torch.Tensor,
                then: torch.Tensor, **kwargs) -> layer_ops.RmsNorm | None:
    """The family's norm (of `weight`) as the RmsNorm that layer_ops' linear of weight `then`
    folds into its input x, where that kernel takes them all (`kwargs`: its other arguments);
    None where it does not: LayerNorm (OPT), more than layer_ops.LINEAR_ROWS rows, the CPU."""
    if model.norm != "rmsnorm" or not x.is_cuda:
        return None
    norm = layer_ops.RmsNorm(weight, model.norm_eps)
    return norm if layer_ops.linear_problem(x, then, norm=norm, **kwargs) is None else None


def _ahead(ahead: Ahead | None, then: torch.Tensor | None,
           gemm_rows: torch.Tensor | None = None) -> dict:
    """The prefetch arguments of a kernel before the GEMM of weight `then` (prefetch_args)."""
    return {} if ahead is None else prefetch_args(ahead.nbytes, then, gemm_rows)


def prefetch_args(nbytes: int, then: torch.Tensor | None,
                  gemm_rows: torch.Tensor | None = None) -> dict:
    """layer_ops' ahead arguments that bring the first `nbytes` of `then` into L2, for the kernel
    before the GEMM of `then`: a linear's, or with `gemm_rows` (the rows that GEMM will take) a
    norm's or SwiGLU's, which prefetches only where cuBLAS runs the GEMMs (more than
    layer_ops.LINEAR_ROWS rows; up to it the linear before does). {} for nbytes 0 or a tensor
    the kernels cannot prefetch (not contiguous, not 16-byte aligned: layer_ops.ahead_problem),
    which a hint leaves out rather than refuses."""
    if (not nbytes or then is None
            or (gemm_rows is not None and gemm_rows.shape[0] <= layer_ops.LINEAR_ROWS)
            or layer_ops.ahead_problem(then, nbytes, then.device)):
        return {}
    return {"ahead": then, "ahead_bytes": nbytes}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, swiglu: bool = False,
           ahead: torch.Tensor | None = None, ahead_bytes: int = 0,
           kv_ahead: layer_ops.PagedAhead | None = None) -> torch.Tensor:
    """F.linear, then residual + its output, or with `swiglu` SwiGLU's product of its halves
    (weight stacks W_gate over W_up): one `layer_ops.linear` kernel where it takes the tensors,
    a decode step of at most layer_ops.LINEAR_ROWS rows on a GPU, which also prefetches the
    first ahead_bytes of `ahead` and kv_ahead's K/V blocks into L2 as it drains. Elsewhere
    F.linear, and SwiGLU's product as `silu_mul`, which takes the prefetch of `ahead`."""
    if x.is_cuda and layer_ops.linear_problem(x, weight, bias, residual, swiglu) is None:
        return layer_ops.linear(x, weight, bias, residual=residual, swiglu=swiglu, ahead=ahead,
                                ahead_bytes=ahead_bytes, kv_ahead=kv_ahead)
    y = F.linear(x, weight, bias)
    if swiglu:
        return silu_mul(y, ahead=ahead, ahead_bytes=ahead_bytes)
    return y if residual is None else residual + y


def silu_mul(gate_up: torch.Tensor, *, ahead: torch.Tensor | None = None,
             ahead_bytes: int = 0) -> torch.Tensor:
    """silu(gate) * up of gate_up [batch, 2 intermediate] (gate, then up in each row): one
    kernel on a GPU, which also brings the first ahead_bytes of `ahead` into L2."""
    if layer_ops.usable(gate_up) and gate_up.is_contiguous():
        return layer_ops.silu_mul(gate_up, ahead=ahead, ahead_bytes=ahead_bytes)
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
