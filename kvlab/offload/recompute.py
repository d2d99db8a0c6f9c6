"""K and V of a decoder layer from its stored input activations, as each model family computes them.

KVPR keeps, for every cached token and layer, the activation that W_K and W_V multiply: the layer's
input after the attention norm (LayerNorm for OPT, RMSNorm for Llama and Qwen2). From it,

    K = X W_K^T (+ b_K),  V = X W_V^T (+ b_V),  and for RoPE families K <- rope(K, position),

with the token's absolute position in its sequence (so a recomputed prefix [0:l] gets positions
0..l-1, and a copied suffix keeps the positions it was written with). OPT adds its learned
positions to the embeddings before the first layer: nothing positional happens here.

Shapes: x [tokens, hidden_size]; k, v [tokens, num_kv_heads, head_dim]; positions [tokens] int.
The same code runs on the CPU (tests) and the GPU (the runtime); on a GPU, fp16 and bf16
RMSNorm and RoPE run as single kernels (`kvlab.kernels.layer_ops`) that equal these torch ops to
the dtype's precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig, RopeScaling
from kvlab.kernels import layer_ops


def seeded_randn(seed: int, dtype, device):
    """`rand(*shape, scale=1.0)`: normal samples from a generator seeded with `seed`, made on
    `device` (so the weights of a 30B model never pass through the host). On the "meta" device
    the tensors have shapes and no data (to size things without allocating them)."""
    if torch.device(device).type == "meta":
        return lambda *shape, scale=1.0: torch.empty(*shape, dtype=dtype, device="meta")
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    return rand


@dataclass
class AttentionWeights:
    """One layer's attention parameters (nn.Linear layout: [out_features, in_features])."""

    w_q: torch.Tensor  # [num_qo_heads * head_dim, hidden]
    w_k: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    w_v: torch.Tensor  # [num_kv_heads * head_dim, hidden]
    w_o: torch.Tensor  # [hidden, num_qo_heads * head_dim]
    b_q: torch.Tensor | None
    b_k: torch.Tensor | None
    b_v: torch.Tensor | None
    norm_weight: torch.Tensor  # [hidden]
    norm_bias: torch.Tensor | None  # LayerNorm only

    @classmethod
    def random(cls, model: ModelConfig, seed: int, dtype=torch.float32, device="cpu"):
        """Seeded random weights of `model`'s shapes, scaled so activations stay O(1)."""
        rand = seeded_randn(seed, dtype, device)
        h = model.hidden_size

        bias = model.qkv_bias
        return cls(
            w_q=rand(model.q_size, h, scale=h ** -0.5),
            w_k=rand(model.kv_size, h, scale=h ** -0.5),
            w_v=rand(model.kv_size, h, scale=h ** -0.5),
            w_o=rand(h, model.q_size, scale=model.q_size ** -0.5),
            b_q=rand(model.q_size, scale=0.1) if bias else None,
            b_k=rand(model.kv_size, scale=0.1) if bias else None,
            b_v=rand(model.kv_size, scale=0.1) if bias else None,
            norm_weight=1 + rand(h, scale=0.1),
            norm_bias=rand(h, scale=0.1) if model.norm == "layernorm" else None,
        )


def norm(model: ModelConfig, hidden: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None) -> torch.Tensor:
    """The family's norm: LayerNorm (OPT) or RMSNorm (Llama, Qwen2), epsilon model.norm_eps."""
    if model.norm == "layernorm":
        return torch.nn.functional.layer_norm(hidden, (model.hidden_size,), weight, bias,
                                              eps=model.norm_eps)
    if _norm_kernel(hidden, weight):
        return layer_ops.rms_norm(hidden, weight, model.norm_eps)[0]
    return torch.nn.functional.rms_norm(hidden, (model.hidden_size,), weight, eps=model.norm_eps)


def add_norm(model: ModelConfig, hidden: torch.Tensor, delta: torch.Tensor,
             weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """(hidden + delta, its norm): a sublayer's residual add and the next norm (one kernel for
    RMSNorm on a GPU)."""
    if model.norm == "rmsnorm" and _norm_kernel(hidden, weight, delta):
        normed, total = layer_ops.rms_norm(hidden, weight, model.norm_eps, residual=delta)
        return total, normed
    hidden = hidden + delta
    return hidden, norm(model, hidden, weight, bias)


def _norm_kernel(*tensors: torch.Tensor) -> bool:
    """Whether layer_ops.rms_norm takes these: the kernels' dtypes on a GPU, [rows, hidden]
    contiguous (every caller's case on a GPU)."""
    hidden = tensors[0]
    return (layer_ops.usable(*tensors) and hidden.dim() == 2
            and all(t.is_contiguous() for t in tensors)
            and all(t.shape == hidden.shape for t in tensors[2:]))


def attention_input(model: ModelConfig, w: AttentionWeights, hidden: torch.Tensor) -> torch.Tensor:
    """The attention norm of the layer input: what KVPR stores per token."""
    return norm(model, hidden, w.norm_weight, w.norm_bias)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None,
                  device) -> torch.Tensor:
    """The rotary frequencies [head_dim / 2] (fp32), with Llama 3's `scaling` where given:
    wavelengths beyond original_max_position / low_freq_factor are slowed by `factor`, those
    within original_max_position / high_freq_factor kept, and the band between blended."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, dtype=torch.float32,
                                       device=device) / head_dim)
    if scaling is None:
        return inv_freq
    s = scaling
    wavelength = 2 * math.pi / inv_freq
    smooth = ((s.original_max_position / wavelength - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor)).clamp(0, 1)
    blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    long = wavelength > s.original_max_position / s.low_freq_factor
    short = wavelength < s.original_max_position / s.high_freq_factor
    return torch.where(long, inv_freq / s.factor, torch.where(short, inv_freq, blended))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype,
                 scaling: RopeScaling | None = None) -> tuple:
    """cos, sin [tokens, head_dim] of the rotary embedding at `positions` (fp32 angles)."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@dataclass(frozen=True)
class RopeTable:
    """cos and sin [max_positions, head_dim] of every position, computed once: a lookup costs one
    indexing op per tensor where `rope_cos_sin` costs a dozen (small ops cost the host more than
    the GPU: see `kvlab.offload.graphs`)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(cls, model: ModelConfig, max_positions: int, dtype, device) -> RopeTable:
        """The table of positions [0, max_positions): size it by the longest sequence that can
        run, not by the model's context limit (which a checkpoint may set at 10**8). Raises
        ValueError unless max_positions is an integer >= 1."""
        check_positive_int("max_positions", max_positions)
        positions = torch.arange(max_positions, device=device)
        return cls(*rope_cos_sin(positions, model.head_dim, model.rope_theta, dtype,
                                 model.rope_scaling))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate x [..., head_dim] by the half-split convention of Llama (and Qwen2): pair i is
    (x[i], x[i + d/2]). cos and sin broadcast against x. `out` may be x itself (in place)."""
    rotated = x.roll(x.shape[-1] // 2, -1)  # (x2, x1)
    rotated[..., : x.shape[-1] // 2].neg_()  # (-x2, x1)
    out = torch.mul(x, cos, out=out)
    return out.addcmul_(rotated, sin)


def project_q(model: ModelConfig, w: AttentionWeights, x: torch.Tensor,
              positions: torch.Tensor, rope: RopeTable | None = None) -> torch.Tensor:
    """Q [tokens, num_qo_heads, head_dim] of the tokens (RoPE applied where the family has it)."""
    q = torch.nn.functional.linear(x, w.w_q, w.b_q).view(-1, model.num_qo_heads, model.head_dim)
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
    k = torch.nn.functional.linear(x, w.w_k, w.b_k).view(shape)
    v = torch.nn.functional.linear(x, w.w_v, w.b_v).view(shape)
    return rotate(model, k, positions, rope), v


def rotate(model: ModelConfig, t: torch.Tensor, positions: torch.Tensor,
           rope: RopeTable | None) -> torch.Tensor:
    """t [tokens, heads, head_dim] with RoPE applied at `positions` [tokens] (a new tensor;
    t itself for a family without RoPE). `rope`: a table covering the positions, else cos and
    sin are computed here. With a table on a GPU, one kernel (t may be a strided view)."""
    if model.position != "rope":
        return t
    if (rope is not None and layer_ops.usable(t, rope.cos) and positions.is_cuda
            and positions.dtype == torch.int64):
        return layer_ops.rope(t, rope.cos, rope.sin, positions)
    if rope is None:
        cos, sin = rope_cos_sin(positions, model.head_dim, model.rope_theta, t.dtype,
                                model.rope_scaling)
    else:
        cos, sin = rope.cos[positions], rope.sin[positions]
    return apply_rope(t, cos[:, None, :], sin[:, None, :])


def recompute_kv(model: ModelConfig, w: AttentionWeights, x: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, start: int, rope: RopeTable | None) -> None:
    """K, V of a range of tokens [start, start + n) of a batch, written in place: x [n, batch,
    hidden] (token-major, as the runtime's buffers hold it) into k, v [n, batch, num_kv_heads,
    head_dim] (contiguous). Equal to `project_kv` at positions start..start + n - 1 for each
    sequence, in fewer operations (the runtime is host-bound on small ones): the GEMMs write
    into k and v, RoPE turns k in place with a slice of the table, no gather."""
    if x.dim() != 3 or x.shape[2] != model.hidden_size:
        raise ValueError(f"x.shape={tuple(x.shape)}: must be [tokens, batch, {model.hidden_size}]")
    shape = (*x.shape[:2], model.num_kv_heads, model.head_dim)
    for name, t in (("k", k), ("v", v)):
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"{name}.shape={tuple(t.shape)}: must be {shape}, contiguous")
    if model.position == "rope" and rope is None:
        raise ValueError(f"rope=None: {model.name} needs a RopeTable")
    rows = x.reshape(-1, model.hidden_size)
    for weight, bias, out in ((w.w_k, w.b_k, k), (w.w_v, w.b_v, v)):
        out = out.view(rows.shape[0], model.kv_size)
        if bias is None:
            torch.mm(rows, weight.t(), out=out)
        else:
            torch.addmm(bias, rows, weight.t(), out=out)
    if model.position == "rope":
        end = start + x.shape[0]
        apply_rope(k, rope.cos[start:end, None, None, :], rope.sin[start:end, None, None, :],
                   out=k)
