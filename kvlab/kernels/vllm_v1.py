"""Launcher for `kernels/paged_decode_vllm.cu`: vLLM's PagedAttention v1/v2 design, on the "vllm"
cache layout, with the optional L2 prefetch of arXiv 2504.06319.

v1: grid (num_qo_heads, num_seqs), one CTA per query head and sequence, logits for the whole
sequence in shared memory. v2: the sequence is cut into 512-token partitions, one CTA each, and a
reduce kernel merges them. The choice is vLLM's (kvlab.kernels.geometry.use_partitions): v1 up
to 8192 tokens when one partition covers the longest sequence or the batch has more than 512
(sequence, query head) pairs; the number of SMs does not enter it.
"""

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.kernels.families import KERNEL_FAMILIES
from kvlab.kernels.geometry import PARTITION_SIZE, VLLM_NUM_WARPS, use_partitions
from kvlab.kernels.geometry import vllm_smem_bytes as smem_bytes
from kvlab.kernels.launch import NULL, launch, ptr, reserve_shared_memory
from kvlab.kernels.prefetch import PrefetchConfig

FAMILY = KERNEL_FAMILIES["vllm_v1"]
SOURCE = FAMILY.source
NUM_THREADS = 32 * VLLM_NUM_WARPS
CUDA_TYPES = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def name_expressions(dtype, head_dim: int, block_size: int, partition_size: int,
                     prefetch: PrefetchConfig) -> tuple[str, ...]:
    """The decode kernel's instantiation, and the reduce kernel's when partitioned."""
    t = CUDA_TYPES[dtype]
    decode = (f"kvlab::vllm_decode<{t}, {head_dim}, {block_size}, {partition_size}, "
              f"{prefetch.template_args()}>")
    if not partition_size:
        return (decode,)
    return decode, f"kvlab::vllm_reduce<{t}, {head_dim}, {partition_size}>"


def default_instances() -> list[str]:
    """What CI compiles with nvcc: every dtype and head_dim, v1 and v2, with and without prefetch,
    at block size 16, and every block size at head_dim 128."""
    configs = [
        (dtype, head_dim, 16, partition_size, prefetch)
        for dtype in CUDA_TYPES
        for head_dim in FAMILY.head_dims
        for partition_size in (0, PARTITION_SIZE)
        for prefetch in (PrefetchConfig(), PrefetchConfig("bulk"), PrefetchConfig("line"))
    ]
    configs += [(torch.float16, 128, bs, 0, PrefetchConfig()) for bs in FAMILY.block_sizes]
    return list(dict.fromkeys(n for config in configs for n in name_expressions(*config)))


class VllmV1:
    """One step's launch of the vllm_v1 family: kernels compiled, grid and buffers sized."""

    warps = VLLM_NUM_WARPS  # per CTA, as vLLM's kernels run

    def __init__(self, cache, num_qo_heads: int, seq_lens: list[int], prefetch: PrefetchConfig,
                 num_sms: int, q_dtype):
        # vLLM's v1/v2 rule does not use num_sms; q_dtype is the cache's (DecodePlan checks it)
        from kvlab.kernels.loader import load

        num_seqs, max_seq_len = len(seq_lens), max(seq_lens)
        self.num_qo_heads, self.num_seqs = num_qo_heads, num_seqs
        self.partition_size = (
            PARTITION_SIZE if use_partitions(num_seqs, num_qo_heads, max_seq_len) else 0
        )
        self.num_partitions = ceil_div(max_seq_len, PARTITION_SIZE) if self.partition_size else 1
        d, bs = cache.head_dim, cache.block_size
        names = name_expressions(cache.dtype, d, bs, self.partition_size, prefetch)
        kernels = load(SOURCE, names, cache.device.index)
        self.decode, self.reduce = kernels[0], kernels[-1]
        self.smem = smem_bytes(d, bs, self.partition_size, max_seq_len)
        reserve_shared_memory(self.decode, self.smem)
        self.partials = None
        if self.partition_size:
            shape = (num_seqs, num_qo_heads, self.num_partitions)
            self.partials = (
                torch.empty(*shape, d, dtype=torch.float32, device=cache.device),
                torch.empty(shape, dtype=torch.float32, device=cache.device),
                torch.empty(shape, dtype=torch.float32, device=cache.device),
            )

    def __call__(self, out, q, k_cache, v_cache, block_tables, seq_lens, scale: float) -> None:
        partial_out, partial_max, partial_sum = (
            map(ptr, self.partials) if self.partials else (NULL, NULL, NULL)
        )
        grid = (self.num_qo_heads, self.num_seqs, self.num_partitions)
        launch(self.decode, grid, (NUM_THREADS,), (
            ptr(out), partial_out, partial_max, partial_sum, ptr(q), ptr(k_cache), ptr(v_cache),
            ptr(block_tables), ptr(seq_lens), np.int32(block_tables.shape[1]),
            np.int32(k_cache.shape[1]), np.int32(self.num_partitions), np.float32(scale),
        ), out.device, self.smem)
        if self.partition_size:
            launch(self.reduce, (self.num_qo_heads, self.num_seqs), (NUM_THREADS,), (
                ptr(out), partial_out, partial_max, partial_sum, ptr(seq_lens),
                np.int32(self.num_partitions),
            ), out.device)
