"""Slow, obviously right references. Every kernel in kvlab is tested against these.

They read the paged cache through its block tables with whole-block tensor ops (a different path
from `PagedKVCache.gather`, which indexes slot by slot), and compute in fp32.
"""

import math
import numbers

import torch

from kvlab.arith import ceil_div
from kvlab.cache import PagedKVCache
from kvlab.cache.fp8 import dequantize

FP32_MAX = float(torch.finfo(torch.float32).max)


def unpack_blocks(cache: PagedKVCache, block_ids: torch.Tensor):
    """K and V of the given blocks as [num_kv_heads, len(block_ids) * block_size, head_dim], in
    the cache's dtype (for an fp8 cache: as stored, not yet multiplied by the scales)."""
    num_kv_heads, head_dim = cache.num_kv_heads, cache.head_dim
    k = cache.k_cache[block_ids.long()]
    v = cache.v_cache[block_ids.long()]
    if cache.layout == "vllm":
        k = k.permute(0, 1, 3, 2, 4)  # [n, H, D/x, bs, x] -> [n, H, bs, D/x, x]
        v = v.transpose(2, 3)  # [n, H, D, bs] -> [n, H, bs, D]
    k = k.reshape(len(block_ids), num_kv_heads, -1, head_dim).transpose(0, 1)
    v = v.reshape(len(block_ids), num_kv_heads, -1, head_dim).transpose(0, 1)
    return k.reshape(num_kv_heads, -1, head_dim), v.reshape(num_kv_heads, -1, head_dim)


def softmax_scale(scale, head_dim: int) -> float:
    """`scale` as a float, or 1 / sqrt(head_dim) for None. ValueError unless it is a finite real
    number of magnitude at most FP32_MAX: the kernels, and this reference, scale in fp32."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
            or not abs(scale) <= FP32_MAX):
        raise ValueError(f"scale={scale!r}: must be a finite real number of magnitude at most "
                         f"{FP32_MAX:.4g} (fp32), or None")
    return float(scale)


def decode_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids, scale: float | None = None):
    """One decode step of attention for each sequence, from the paged cache, in fp32. An fp8
    cache's K and V are dequantised first (times k_scale, v_scale per KV head).

    Args:
        q: [B, num_qo_heads, head_dim], floating point, on the cache's device. Query head h reads
            KV head h // (num_qo_heads // num_kv_heads).
        seq_ids: B >= 1 live sequence ids of `cache`; row b of q attends to all of seq_ids[b]'s
            tokens.
        scale: softmax scale (`softmax_scale`); default 1 / sqrt(head_dim).
    Returns:
        float32 [B, num_qo_heads, head_dim].
    Raises:
        ValueError for no seq_ids, a q of the wrong shape, dtype or device, a head count that is
        not a positive multiple of the cache's num_kv_heads, a scale that is not a finite real
        number fp32 holds, or an unknown seq_id.
    """
    seq_ids = list(seq_ids)
    if not seq_ids:
        raise ValueError("seq_ids=[]: must name at least one sequence")
    _check_q(q, cache, len(seq_ids))
    scale = softmax_scale(scale, cache.head_dim)
    group = q.shape[1] // cache.num_kv_heads
    tables, seq_lens = cache.block_tables(seq_ids), cache.seq_lens(seq_ids).tolist()
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for b, seq_len in enumerate(seq_lens):
        num_blocks = ceil_div(seq_len, cache.block_size)
        k, v = unpack_blocks(cache, tables[b, :num_blocks])
        k, v = k[:, :seq_len].float(), v[:, :seq_len].float()  # [num_kv_heads, seq_len, D]
        if cache.k_scale is not None:
            k, v = dequantize(k, cache.k_scale, 0), dequantize(v, cache.v_scale, 0)
        k = k.repeat_interleave(group, dim=0)  # [num_qo_heads, seq_len, D]
        v = v.repeat_interleave(group, dim=0)
        scores = torch.einsum("hd,hnd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(dim=-1), v)
    return out


def _check_q(q, cache: PagedKVCache, batch_size: int) -> None:
    if not isinstance(q, torch.Tensor) or not q.is_floating_point():
        raise ValueError(f"q: must be a floating-point torch.Tensor, got {q!r:.60}")
    if q.dim() != 3 or q.shape[0] != batch_size or q.shape[2] != cache.head_dim:
        raise ValueError(
            f"q.shape={tuple(q.shape)}: must be [B={batch_size} (one row per seq_id), "
            f"num_qo_heads, head_dim={cache.head_dim}]"
        )
    if q.shape[1] < 1 or q.shape[1] % cache.num_kv_heads:
        raise ValueError(
            f"num_qo_heads={q.shape[1]}: must be a positive multiple of the cache's "
            f"num_kv_heads={cache.num_kv_heads}"
        )
    if q.device != cache.device:
        raise ValueError(f"q.device={q.device}: must be the cache's {cache.device}")
