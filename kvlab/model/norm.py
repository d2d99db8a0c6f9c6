"""The family's norms: LayerNorm (OPT) and RMSNorm (Llama, Qwen2), of epsilon model.norm_eps. On
a GPU, fp16 and bf16 RMSNorm, alone or with the residual add before it, runs as one kernel
(`kvlab.kernels.layer_ops`) that equals these torch ops to the dtype's precision.

Shapes: hidden, delta [rows, hidden_size]; weight, bias [hidden_size].
"""

from __future__ import annotations

import torch

from kvlab.config import ModelConfig
from kvlab.kernels import layer_ops


def norm(model: ModelConfig, hidden: torch.Tensor, weight: torch.Tensor,
         bias: torch.Tensor | None, *, ahead: torch.Tensor | None = None,
         ahead_bytes: int = 0) -> torch.Tensor:
    """The family's norm: LayerNorm (OPT) or RMSNorm (Llama, Qwen2), epsilon model.norm_eps.
    ahead, ahead_bytes: the cross-kernel prefetch of the next GEMM's weight, which the RMSNorm
    kernel takes (layer_ops.rms_norm) and torch's ops ignore."""
    if model.norm == "layernorm":
        return torch.nn.functional.layer_norm(hidden, (model.hidden_size,), weight, bias,
                                              eps=model.norm_eps)
    if _norm_kernel(hidden, weight):
        return layer_ops.rms_norm(hidden, weight, model.norm_eps, ahead=ahead,
                                  ahead_bytes=ahead_bytes)[0]
    return torch.nn.functional.rms_norm(hidden, (model.hidden_size,), weight, eps=model.norm_eps)


def add_norm(model: ModelConfig, hidden: torch.Tensor, delta: torch.Tensor,
             weight: torch.Tensor, bias: torch.Tensor | None, *,
             ahead: torch.Tensor | None = None, ahead_bytes: int = 0) -> tuple:
    """(hidden + delta, its norm): a sublayer's residual add and the next norm (one kernel for
    RMSNorm on a GPU, which also takes `norm`'s cross-kernel prefetch)."""
    if model.norm == "rmsnorm" and _norm_kernel(hidden, weight, delta):
        normed, total = layer_ops.rms_norm(hidden, weight, model.norm_eps, residual=delta,
                                           ahead=ahead, ahead_bytes=ahead_bytes)
        return total, normed
    hidden = hidden + delta
    return hidden, norm(model, hidden, weight, bias, ahead=ahead, ahead_bytes=ahead_bytes)


def _norm_kernel(*tensors: torch.Tensor) -> bool:
    """Whether layer_ops.rms_norm takes these: the kernels' dtypes on a GPU, [rows, hidden]
    contiguous (every caller's case on a GPU)."""
    hidden = tensors[0]
    return (layer_ops.usable(*tensors) and hidden.dim() == 2
            and all(t.is_contiguous() for t in tensors)
            and all(t.shape == hidden.shape for t in tensors[2:]))
