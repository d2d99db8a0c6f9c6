"""Launcher for `kernels/paged_decode_gqa.cu`: a group-aware paged decode kernel on the "hnd"
layout, with split-KV and the optional L2 prefetch of arXiv 2504.06319.

One CTA handles one (sequence partition, KV head) and all query heads of that head's group, so each
KV byte is read from HBM once. When num_seqs x num_kv_heads CTAs cannot fill the GPU, each
sequence is cut into partitions (multiples of 256 tokens) spread over more CTAs, and a merge kernel
combines the partitions' partial outputs by their log-sum-exp. A batch of mixed lengths, split or
not, is launched as a work list of the partitions its sequences fill, longest first, so that the
short ones fill the launch's tail; a launch that fits one wave pairs a long and a short CTA on each
SM instead. A CTA has 4 warps, or 8 where the launch's CTAs would run one an SM too few to keep
HBM busy (few sequences and KV heads, or an fp8 cache): `geometry.split_plan`.
"""

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.cache.fp8 import FP8_DTYPE
from kvlab.kernels.families import KERNEL_FAMILIES
from kvlab.kernels.geometry import GQA_NUM_WARPS as NUM_WARPS
from kvlab.kernels.geometry import ctas_per_sm, one_wave_order, split_plan, work_list
from kvlab.kernels.geometry import gqa_smem_bytes as smem_bytes
from kvlab.kernels.launch import NULL, launch, launch_dependent, ptr, reserve_shared_memory
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.kernels.vllm_v1 import CUDA_TYPES

FAMILY = KERNEL_FAMILIES["gqa"]
SOURCE = FAMILY.source
FP8_TYPE = "kvlab::fp8_e4m3"
MERGE_THREADS = 128


def name_expressions(dtype, head_dim: int, block_size: int, group: int,
                     prefetch: PrefetchConfig, kv_dtype=None,
                     warps: int = NUM_WARPS) -> tuple[str, str]:
    """The decode kernel's instantiation and the merge kernel's: q and out in `dtype`, the caches
    in `kv_dtype` (default: `dtype`; or FP8_DTYPE, with dtype float16 or bfloat16), CTAs of
    `warps` warps (4 or 8)."""
    t = CUDA_TYPES[dtype]
    kv = FP8_TYPE if kv_dtype == FP8_DTYPE else t
    return (
        f"kvlab::gqa_decode<{t}, {kv}, {head_dim}, {block_size}, {group}, "
        f"{prefetch.template_args()}, {warps}>",
        f"kvlab::gqa_merge<{t}, {head_dim}>",
    )


def query_dtypes(cache_dtype) -> tuple:
    """The dtypes q and out may have over a cache of `cache_dtype`, the default first: the cache's
    own; float16 or bfloat16 over fp8."""
    return (torch.float16, torch.bfloat16) if cache_dtype == FP8_DTYPE else (cache_dtype,)


def default_instances() -> list[str]:
    """What CI compiles with nvcc: every dtype and head_dim, MHA and GQA 4:1, with and without
    prefetch, at block size 16, and every block size at head_dim 128; fp8 caches at every
    head_dim, MHA and GQA 4:1, without prefetch and with the bulk one, and without prefetch
    for a bf16 q. CTAs of 8 warps (not at head_dim 256, whose stages would not fit an SM): fp16
    at every other head_dim, MHA and GQA 4:1, without prefetch and with the line one; blocks of
    8 and 256 with the bulk one; fp8 at GQA 4:1 without prefetch."""
    configs = [
        (dtype, head_dim, 16, group, prefetch)
        for dtype in CUDA_TYPES
        for head_dim in FAMILY.head_dims
        for group in (1, 4)
        for prefetch in (PrefetchConfig(), PrefetchConfig("bulk"), PrefetchConfig("line"))
    ]
    configs += [(torch.float16, 128, bs, 4, PrefetchConfig()) for bs in FAMILY.block_sizes]
    configs += [(torch.float16, head_dim, 16, group, prefetch, FP8_DTYPE)
                for head_dim in FAMILY.head_dims for group in (1, 4)
                for prefetch in (PrefetchConfig(), PrefetchConfig("bulk"))]
    configs += [(torch.bfloat16, head_dim, 16, group, PrefetchConfig(), FP8_DTYPE)
                for head_dim in FAMILY.head_dims for group in (1, 4)]
    eight = [d for d in FAMILY.head_dims if d != 256]
    configs += [(torch.float16, head_dim, 16, group, prefetch, None, 8)
                for head_dim in eight for group in (1, 4)
                for prefetch in (PrefetchConfig(), PrefetchConfig("line"))]
    configs += [(torch.float16, 128, bs, 4, PrefetchConfig("bulk"), None, 8) for bs in (8, 256)]
    configs += [(torch.float16, head_dim, 16, 4, PrefetchConfig(), FP8_DTYPE, 8)
                for head_dim in eight]
    return list(dict.fromkeys(n for config in configs for n in name_expressions(*config)))


class Gqa:
    """One step's launch of the gqa family: kernels compiled, split planned, buffers sized."""

    def __init__(self, cache, num_qo_heads: int, seq_lens: list[int], prefetch: PrefetchConfig,
                 num_sms: int, q_dtype):
        from kvlab.kernels.loader import load

        num_seqs, max_seq_len = len(seq_lens), max(seq_lens)
        self.num_qo_heads, self.num_seqs, self.num_kv_heads = (
            num_qo_heads, num_seqs, cache.num_kv_heads
        )
        kv_bytes = cache.k_cache.element_size()
        mixed = min(seq_lens) != max_seq_len
        per_sm = ctas_per_sm(cache.head_dim, kv_bytes)
        self.partition_size, self.warps = split_plan(
            num_seqs, cache.num_kv_heads, max_seq_len, num_sms, per_sm,
            2 * cache.head_dim * kv_bytes, seq_lens if mixed else None,
            eight_warps=ctas_per_sm(cache.head_dim, kv_bytes, 8) >= 1)
        self.num_partitions = ceil_div(max_seq_len, self.partition_size)
        # mixed lengths: only the partitions that hold tokens, longest first (in one wave, long
        # and short paired an SM)
        self.work = self.merged = None
        if mixed:
            work = one_wave_order(work_list(seq_lens, self.partition_size), cache.num_kv_heads,
                                  num_sms, per_sm)
            self.work = torch.from_numpy(work).to(cache.device)
            # the merge's sequences: the split ones (a sequence of one partition is written by
            # its decode CTA)
            split = np.flatnonzero(np.asarray(seq_lens) > self.partition_size).astype(np.int32)
            self.merged = torch.from_numpy(split).to(cache.device)
        d, group = cache.head_dim, num_qo_heads // cache.num_kv_heads
        names = name_expressions(q_dtype, d, cache.block_size, group, prefetch, cache.dtype,
                                 self.warps)
        self.names = names  # the decode kernel's instantiation and the merge kernel's
        self.decode, self.merge = load(SOURCE, names, cache.device.index)
        # fp8: the per-head scales, read at launch (a later first write may still set them)
        self.scales = (cache.k_scale, cache.v_scale) if cache.k_scale is not None else None
        self.smem = smem_bytes(d, kv_bytes, self.warps)
        reserve_shared_memory(self.decode, self.smem)
        self.partials = None
        if self.num_partitions > 1:
            shape = (num_seqs, num_qo_heads, self.num_partitions)
            self.partials = (
                torch.empty(*shape, d, dtype=torch.float32, device=cache.device),
                torch.empty(shape, dtype=torch.float32, device=cache.device),
            )

    @property
    def decode_grid(self) -> tuple[int, int, int]:
        """The decode launch's grid (see the launch contract in the kernel's source)."""
        if self.work is None:
            return self.num_partitions, self.num_kv_heads, self.num_seqs
        return self.work.shape[0] * self.num_kv_heads, 1, 1

    @property
    def merge_grid(self) -> tuple[int, int] | None:
        """The merge launch's grid (query heads, sequences merged); None where the decode launch
        writes every `out` itself."""
        if not self.partials:
            return None
        return self.num_qo_heads, self.num_seqs if self.merged is None else self.merged.numel()

    def __call__(self, out, q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> None:
        partial_out, partial_lse = map(ptr, self.partials) if self.partials else (NULL, NULL)
        grid = self.decode_grid
        work = NULL if self.work is None else ptr(self.work)
        k_scale, v_scale = map(ptr, self.scales) if self.scales else (NULL, NULL)
        launch(self.decode, grid, (32 * self.warps,), (
            ptr(out), partial_out, partial_lse, ptr(q), ptr(k_cache), ptr(v_cache), k_scale,
            v_scale, ptr(block_tables), ptr(seq_lens), work, np.int32(block_tables.shape[1]),
            np.int32(self.num_kv_heads), np.int32(self.partition_size),
            np.int32(self.num_partitions), np.float32(scale),
        ), out.device, self.smem)
        if self.partials:  # starts while the decode launch ends (it waits for its results)
            launch_dependent(self.merge, self.merge_grid, (MERGE_THREADS,), (
                ptr(out), partial_out, partial_lse, ptr(seq_lens),
                NULL if self.merged is None else ptr(self.merged), np.int32(self.partition_size),
                np.int32(self.num_partitions),
            ), out.device)
