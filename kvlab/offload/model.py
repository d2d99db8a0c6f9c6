"""A decoder's layers with seeded random weights of a model's published shapes, and one decode
step of one layer: what the KVPR runtime computes between its copies.

Layer (pre-norm, both families):
    x = attention_norm(h);  h = h + W_O attention(Q(x), K, V) (+ b_O)
    h = h + MLP(mlp_norm(h))
OPT: LayerNorm, MLP = fc2(relu(fc1 .)) with biases, out_proj bias. Llama / Qwen2: RMSNorm,
MLP = down(silu(gate .) * up .), no MLP biases. Tensors of a batch are [batch, ...]; a layer's
K, V are [tokens, batch, num_kv_heads, head_dim] (the host store's token-major layout).

`fuse` stacks a layer's projections that share an input (Q, K, V; gate, up), so that a decode
step runs one GEMM where it ran three or two: at a small batch each GEMM reads its weights at
well under the copy roofline, and fewer, larger ones read faster (Llama-3-8B's linears on the
H200 at batch 1: 3.23 TB/s apart, 3.59 TB/s stacked; session probe).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kvlab.cache.paged_cache import check_device
from kvlab.config import ModelConfig
from kvlab.kernels import layer_ops
from kvlab.offload.recompute import (
    AttentionWeights,
    RopeTable,
    add_norm,
    attention_input,
    project_kv,
    project_q,
    rotate,
    seeded_randn,
)


@dataclass
class LayerWeights:
    attn: AttentionWeights
    b_o: torch.Tensor | None
    mlp_norm_weight: torch.Tensor
    mlp_norm_bias: torch.Tensor | None
    w_gate: torch.Tensor | None  # silu families only
    w_up: torch.Tensor
    b_up: torch.Tensor | None
    w_down: torch.Tensor
    b_down: torch.Tensor | None

    @classmethod
    def random(cls, model: ModelConfig, seed: int, dtype=torch.float32, device="cpu"):
        rand = seeded_randn(seed + 1_000_003, dtype, device)
        h, ffn, opt = model.hidden_size, model.intermediate_size, model.family == "opt"
        return cls(
            attn=AttentionWeights.random(model, seed, dtype, device),
            b_o=rand(h, scale=0.1) if opt else None,
            mlp_norm_weight=1 + rand(h, scale=0.1),
            mlp_norm_bias=rand(h, scale=0.1) if model.norm == "layernorm" else None,
            w_gate=None if opt else rand(ffn, h, scale=h ** -0.5),
            w_up=rand(ffn, h, scale=h ** -0.5),
            b_up=rand(ffn, scale=0.1) if opt else None,
            w_down=rand(h, ffn, scale=ffn ** -0.5),
            b_down=rand(h, scale=0.1) if opt else None,
        )


@dataclass(frozen=True)
class Fused:
    """A layer's stacked projections (see `fuse`): qkv [q_size + 2 kv_size, hidden] (W_Q, W_K,
    W_V) with b_qkv where the family has biases, and gate_up [2 intermediate, hidden] (W_gate,
    W_up; None for OPT, which has no gate)."""

    qkv: torch.Tensor
    b_qkv: torch.Tensor | None
    gate_up: torch.Tensor | None


def fuse(w: LayerWeights) -> Fused:
    """Stack w's projections that share an input and point w's own fields at row blocks of the
    stacks (views, in place), so that nothing is stored twice and everything that reads w
    (the HF model sharing its tensors, the KVPR runtime) sees the same numbers."""
    a = w.attn
    qkv = torch.cat([a.w_q, a.w_k, a.w_v])
    rows = [len(a.w_q), len(a.w_k), len(a.w_v)]
    a.w_q, a.w_k, a.w_v = qkv.split(rows)
    b_qkv = None
    if a.b_q is not None:
        b_qkv = torch.cat([a.b_q, a.b_k, a.b_v])
        a.b_q, a.b_k, a.b_v = b_qkv.split(rows)
    gate_up = None
    if w.w_gate is not None:
        gate_up = torch.cat([w.w_gate, w.w_up])
        w.w_gate, w.w_up = gate_up.split([len(w.w_gate), len(w.w_up)])
    return Fused(qkv, b_qkv, gate_up)


def random_layers(model: ModelConfig, seed: int = 0, dtype=torch.float32, device="cpu",
                  num_layers: int | None = None) -> list[LayerWeights]:
    """Seeded random weights for the first `num_layers` layers (default: all) of `model`."""
    count = model.num_layers if num_layers is None else num_layers
    return [LayerWeights.random(model, seed + 7919 * i, dtype, device) for i in range(count)]


def resolve_device(device) -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device. Raises ValueError, as
    PagedKVCache does, for what is not a device or a CUDA device that is not there."""
    device = check_device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


KV_FIELDS = ("attn.w_k", "attn.b_k", "attn.w_v", "attn.b_v")  # what recomputation needs


def named_tensors(w: LayerWeights) -> dict[str, torch.Tensor]:
    """The layer's tensors by dotted field name ("attn.w_k", "w_up", ...), KV_FIELDS first;
    fields that are None (biases a family lacks) are left out."""
    named = {}
    for field in dataclasses.fields(w):
        value = getattr(w, field.name)
        if dataclasses.is_dataclass(value):
            named.update({f"{field.name}.{f.name}": getattr(value, f.name)
                          for f in dataclasses.fields(value)})
        else:
            named[field.name] = value
    named = {name: t for name, t in named.items() if t is not None}
    return {**{n: named[n] for n in KV_FIELDS if n in named},
            **{n: t for n, t in named.items() if n not in KV_FIELDS}}


def check_layers(model: ModelConfig, layers: list[LayerWeights], dtype: torch.dtype,
                 device) -> None:
    """Raise ValueError unless `layers` are `model`'s num_layers layers, each tensor with the
    shape `random_layers(model)` gives it (and None where it gives None), of `dtype`, on
    `device`. The error names the first wrong layer and tensor."""
    if len(layers) != model.num_layers:
        raise ValueError(f"len(layers)={len(layers)}: must be {model.name}'s {model.num_layers}")
    device = resolve_device(device)
    shapes = {name: tuple(t.shape)
              for name, t in named_tensors(LayerWeights.random(model, 0, device="meta")).items()}
    for i, w in enumerate(layers):
        if not isinstance(w, LayerWeights):
            raise ValueError(f"layers[{i}]: {type(w).__name__}, must be LayerWeights")
        tensors = named_tensors(w)
        for name in [*shapes, *(n for n in tensors if n not in shapes)]:
            t, shape, where = tensors.get(name), shapes.get(name), f"layers[{i}].{name}"
            if (None if t is None else tuple(t.shape)) != shape:
                got = "None" if t is None else f"shape {tuple(t.shape)}"
                raise ValueError(f"{where}: {got}, must be {shape} for {model.name}")
            if t.dtype != dtype:
                raise ValueError(f"{where}: {t.dtype}, must be {dtype}")
            if t.device != device:
                raise ValueError(f"{where}: on {t.device}, must be on {device}")


# NOTE: not cuDNN's SDPA: on the H200 its first call at each new sequence length was seen to take
# 20-40 ms (plan building, it seems; not recorded), and a decode loop meets a new length every
# step.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(model: ModelConfig, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Decode attention: q [batch, num_qo_heads, d] over k, v [tokens, batch, num_kv_heads, d]."""
    k, v = (t.permute(1, 2, 0, 3) for t in (k, v))  # [batch, heads, tokens, d]
    with sdpa_kernel(SDPA_BACKENDS):
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v,
                                             enable_gqa=model.num_kv_heads != model.num_qo_heads)
    return out[:, :, 0, :]


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
