"""Rotary position embedding (Llama, Qwen2): the rotary frequencies with Llama 3's scaling, cos
and sin of positions computed or looked up in a table built once, and the rotation by the
half-split convention. On a GPU, with a table, fp16 and bf16 RoPE runs as one kernel
(`kvlab.kernels.layer_ops`) that equals these torch ops to the dtype's precision.

Shapes: t [tokens, heads, head_dim]; positions [tokens] int; cos, sin [tokens, head_dim].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig, RopeScaling
from kvlab.kernels import layer_ops


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
