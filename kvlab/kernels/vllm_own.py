"""vLLM's own PagedAttention v1/v2 kernels, timed beside `vllm_v1` (`bench attention --vllm-cubin`).

kvlab ships no vLLM code. The kernels come from a cubin that `benchmarks/vllm_cubin.sh` builds
from a vLLM source tree (its paged-attention templates instantiated for fp16 at head_dim 128 and
blocks 8, 16 and 32, compiled by nvcc with vLLM's flags). `VllmOwn` launches them as vLLM's
launcher does, on a cache of vllm_v1's layout (the same as vLLM's): the grid, 128 threads, the
shared memory, the v1/v2 rule (kvlab.kernels.geometry.use_partitions) and v2's reduce kernel with
its fp16 partial outputs.

The kernels are found by their mangled names, which the template arguments and vLLM's kernel
signature fix (checked against vLLM 0.9.2's, whose kernels take block-sparse arguments): a cubin
without them, such as one built from a vLLM whose signature differs, gets a ValueError that names
what was missing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.kernels.geometry import (
    PARTITION_SIZE,
    VLLM_NUM_WARPS,
    use_partitions,
    vllm_smem_bytes,
)
from kvlab.kernels.launch import NULL, launch, ptr, reserve_shared_memory

NUM_THREADS = 32 * VLLM_NUM_WARPS
HEAD_DIMS = (128,)
BLOCK_SIZES = (8, 16, 32)
DTYPES = (torch.float16,)


def mangled_names(head_dim: int, block_size: int) -> tuple[str, str, str]:
    """(v1, v2, reduce): the symbols of vLLM's fp16 kernels (scalar and cache type uint16_t, 128
    threads, no fp8, no block sparsity, 512-token partitions) for head_dim and block_size."""
    shape = f"Li{head_dim}ELi{block_size}ELi{NUM_THREADS}ELNS_18Fp8KVCacheDataTypeE0ELb0E"
    v1 = (f"_ZN4vllm25paged_attention_v1_kernelItt{shape}EEvPT_PKS2_PKT0_S8_"
          "ifPKiSA_iPKfiiiSC_SC_iiiii")
    v2 = (f"_ZN4vllm25paged_attention_v2_kernelItt{shape}Li{PARTITION_SIZE}EEEvPfS2_PT_PKS3_"
          "PKT0_S9_ifPKiSB_iPKfiiiSD_SD_iiiii")
    reduce = (f"_ZN4vllm32paged_attention_v2_reduce_kernelItLi{head_dim}ELi{NUM_THREADS}"
              f"ELi{PARTITION_SIZE}EEEvPT_PKfS4_PKS1_PKii")
    return v1, v2, reduce


def describe(path) -> dict:
    """What a benchmark records about the cubin at `path`: its file name, sha256 and the build
    notes that vllm_cubin.sh writes beside it (PATH.json: vLLM's version, nvcc's, the flags),
    if there. Raises ValueError if `path` is not a readable file."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--vllm-cubin {str(path)!r}: no such file (build one with "
                         "benchmarks/vllm_cubin.sh)")
    info = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    notes = path.with_name(path.name + ".json")
    if notes.is_file():
        try:
            info["build"] = json.loads(notes.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{str(notes)!r}: not JSON ({err}); vllm_cubin.sh writes it") from None
    return info


_modules: dict[tuple[str, int], object] = {}


def _kernels(path: str, device_index: int, names: tuple[str, ...]) -> list:
    from kvlab.kernels.loader import import_cupy

    cupy = import_cupy()
    key = (str(Path(path).resolve()), device_index)
    with cupy.cuda.Device(device_index):
        if key not in _modules:
            _modules[key] = cupy.RawModule(path=key[0])
        found = []
        for name in names:
            try:
                found.append(_modules[key].get_function(name))
            except cupy.cuda.driver.CUDADriverError as err:
                raise ValueError(f"--vllm-cubin {path!r} has no kernel {name} ({err}); build it "
                                 "with benchmarks/vllm_cubin.sh") from None
    return found


class VllmOwn:
    """One step's launch of vLLM's own kernels from the cubin at `path`, for `cache` (layout
    "vllm", fp16, head_dim 128, block 8, 16 or 32) and the batch's `seq_lens`. Raises ValueError
    for another cache, or a cubin without the kernels, before anything is launched."""

    def __init__(self, path, cache, num_qo_heads: int, seq_lens: list[int]):
        if cache.layout != "vllm":
            raise ValueError(f"cache.layout={cache.layout!r}: vLLM's kernels read the 'vllm' "
                             "layout")
        if cache.dtype not in DTYPES or cache.head_dim not in HEAD_DIMS or (
                cache.block_size not in BLOCK_SIZES):
            raise ValueError(f"cache: dtype={cache.dtype}, head_dim={cache.head_dim}, "
                             f"block_size={cache.block_size}: vllm_cubin.sh builds vLLM's "
                             f"kernels for dtype float16, head_dim {HEAD_DIMS}, block sizes "
                             f"{BLOCK_SIZES}")
        num_seqs, max_seq_len = len(seq_lens), max(seq_lens)
        self.num_qo_heads, self.num_seqs, self.num_kv_heads = (num_qo_heads, num_seqs,
                                                               cache.num_kv_heads)
        self.v2 = use_partitions(num_seqs, num_qo_heads, max_seq_len)
        self.variant = "v2" if self.v2 else "v1"
        v1, v2, reduce = mangled_names(cache.head_dim, cache.block_size)
        device, head_dim = cache.device, cache.head_dim
        self.smem = vllm_smem_bytes(head_dim, cache.block_size, PARTITION_SIZE if self.v2 else 0,
                                    max_seq_len)
        if self.v2:
            self.decode, self.reduce = _kernels(path, device.index, (v2, reduce))
            self.num_partitions = ceil_div(max_seq_len, PARTITION_SIZE)
            shape = (num_seqs, num_qo_heads, self.num_partitions)
            self.exp_sums = torch.empty(shape, dtype=torch.float32, device=device)
            self.max_logits = torch.empty(shape, dtype=torch.float32, device=device)
            self.tmp_out = torch.empty(*shape, head_dim, dtype=cache.dtype, device=device)
        else:
            (self.decode,) = _kernels(path, device.index, (v1,))
            self.num_partitions = 1
        reserve_shared_memory(self.decode, self.smem)
        self.scale = 1.0 / head_dim ** 0.5
        self.unit_scale = torch.ones(1, dtype=torch.float32, device=device)  # k_scale, v_scale

    def __call__(self, out, q, k_cache, v_cache, block_tables, seq_lens) -> None:
        """out[B, num_qo_heads, head_dim] = attention of q (same shape, fp16, contiguous)."""
        common = (np.int32(self.num_kv_heads), np.float32(self.scale), ptr(block_tables),
                  ptr(seq_lens), np.int32(block_tables.shape[1]), NULL,  # no ALiBi
                  np.int32(q.stride(0)), np.int32(k_cache.stride(0)), np.int32(k_cache.stride(1)),
                  ptr(self.unit_scale), ptr(self.unit_scale), np.int32(0),  # tp_rank
                  np.int32(0), np.int32(0), np.int32(0), np.int32(0))  # no block sparsity
        heads, seqs = self.num_qo_heads, self.num_seqs
        caches = (ptr(q), ptr(k_cache), ptr(v_cache))
        if not self.v2:
            launch(self.decode, (heads, seqs, 1), (NUM_THREADS,), (ptr(out), *caches, *common),
                   out.device, self.smem)
            return
        partials = (ptr(self.exp_sums), ptr(self.max_logits), ptr(self.tmp_out))
        launch(self.decode, (heads, seqs, self.num_partitions), (NUM_THREADS,),
               (*partials, *caches, *common), out.device, self.smem)
        launch(self.reduce, (heads, seqs), (NUM_THREADS,),
               (ptr(out), *partials, ptr(seq_lens), np.int32(self.num_partitions)),
               out.device, 2 * self.num_partitions * 4)
