"""fp8 (e4m3) storage for the paged KV cache: one float32 scale per KV head, fixed by the first
write that carries a nonzero value for that head.

Stored value = e4m3(clamp(value / scale, -E4M3_MAX, E4M3_MAX)); read value = stored * scale.

NOTE: a fixed per-head scale is what lets a decode kernel dequantise with one multiply per head
(the scale does not depend on the block or the token). Its known limit: a first write smaller
than later values saturates those later values at +-E4M3_MAX * scale. `FP8Scales.saturated`
counts the elements clamped so far, so a user can tell.

Error of one element inside the range (|value / scale| >= 2**-6, e4m3's smallest normal): at most
2**-4 relative (3 mantissa bits, round to nearest). Below that (subnormal), at most
2**-10 * scale absolute.

What it costs attention, measured with the CPU reference against the same data in an fp16 cache
(`pytest -s tests/cache/test_fp8.py -k accuracy`; GQA 4:1, head_dim 128, 4 sequences of 1-1000
tokens; relative L2 error of each (sequence, query head) output): 0.029-0.058 at worst for random
K; with real-like K, 4 of 128 channels 20x larger, 0.45-0.57 at worst from 17 tokens on (mean
0.08-0.19). The per-element error scales with the largest channel whatever the scale is, so
outlier channels need more than a per-head scale (rotating or smoothing K, or keeping them at
higher precision).
"""

import torch

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # e4m3fn's largest finite value, torch.finfo(torch.float8_e4m3fn).max
SOURCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what an fp8 cache is written from


def check_source(name: str, t: torch.Tensor) -> None:
    """ValueError unless `t` (K or V written to an fp8 cache) is fp16/bf16/fp32 and finite."""
    if t.dtype not in SOURCE_DTYPES:
        raise ValueError(
            f"{name}.dtype={t.dtype}: an fp8 cache is written from one of {SOURCE_DTYPES}"
        )
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: holds NaN or inf; an fp8 cache stores finite values only")


class FP8Scales:
    """The per-head scales of one tensor (K or V) of an fp8 cache, and its saturation count.

    Attributes:
        scale: float32 [num_kv_heads] on `device`; 1.0 until a head's first nonzero write.
        is_set: bool [num_kv_heads]: whether a head's scale was fixed by a write.
        saturated: int, elements clamped to +-E4M3_MAX so far.
    """

    def __init__(self, num_kv_heads: int, device: torch.device):
        self.scale = torch.ones(num_kv_heads, dtype=torch.float32, device=device)
        self.is_set = torch.zeros(num_kv_heads, dtype=torch.bool, device=device)
        self.saturated = 0

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """x: [n, num_kv_heads, head_dim], fp16/bf16/fp32, finite. Fixes the scale of each head
        not yet set whose values in x are not all zero (amax / E4M3_MAX), then returns x as
        float8_e4m3fn [n, num_kv_heads, head_dim], counting the elements it clamps."""
        x = x.float()
        amax = x.abs().amax(dim=(0, 2))  # [num_kv_heads]
        fix = ~self.is_set & (amax > 0)
        first = amax / E4M3_MAX
        # NOTE: fp32 rounding can leave amax / first just above E4M3_MAX; one ulp more keeps the
        # first write's own amax from counting as saturated.
        first = torch.where(amax / first > E4M3_MAX, torch.nextafter(first, amax), first)
        self.scale.copy_(torch.where(fix, first, self.scale))  # in place: a plan may hold it
        self.is_set |= fix
        scaled = x / self.scale[:, None]
        self.saturated += int((scaled.abs() > E4M3_MAX).sum())
        return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)


def dequantize(x: torch.Tensor, scale: torch.Tensor, head_axis: int) -> torch.Tensor:
    """float32 x * scale: scale [num_kv_heads] broadcast along x's KV-head axis `head_axis`."""
    shape = [1] * x.dim()
    shape[head_axis] = -1
    return x.float() * scale.view(shape)
