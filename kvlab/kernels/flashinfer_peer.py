"""FlashInfer's paged decode on kvlab's own paged cache: the field's kernel as a peer of `gqa`.

FlashInfer (pip package `flashinfer-python`) describes a batch's blocks in CSR form, where kvlab
keeps a padded block table per sequence; `kv_csr` turns one into the other. `FlashInferDecode`
plans FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` once for a batch and runs it on the
cache's own K and V tensors: kvlab's "hnd" layout, [num_blocks, num_kv_heads, block_size,
head_dim] each, is FlashInfer's kv_layout="HND", handed over as the tuple (k_cache, v_cache), so
nothing is copied. `use_tensor_cores=True` picks FlashInfer's tensor-core path for grouped queries
(its FA2 prefill kernel with one query token); False, its CUDA-core decode kernel. Both are
pinned to FlashInfer's own FA2 kernels (BACKEND), never left to its "auto" choice.

flashinfer is imported on first use, never by `import kvlab`: `unavailable_reason()` says why it
cannot run here. The version the benchmarks are recorded with is FLASHINFER_VERSION
(benchmarks/flashinfer_wheels.sh fetches its wheel for the device machine).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math

import torch

from kvlab.arith import ceil_div

FLASHINFER_VERSION = "0.7.2.post1"  # the flashinfer-python release the benchmarks pin
INSTALL = f"pip install flashinfer-python=={FLASHINFER_VERSION}"
WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's float workspace (its split-KV partial outputs)
# Its FA2 kernels, on both paths: backend "auto" may hand a plan to cuDNN (or, for fp8 on the
# tensor-core path, to FA3), and then the row would time another library's kernel.
BACKEND = "fa2"
# Query heads a KV head that FlashInfer's CUDA-core decode is compiled for (DISPATCH_GQA_GROUP_SIZE
# in include/flashinfer/utils.cuh of FLASHINFER_VERSION); its tensor-core path takes any group.
CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
Q_DTYPES = (torch.float16, torch.bfloat16)
DEVICE_TYPES = ("cuda",)  # where the cache may live (the CPU tests add "cpu" for a fake library)


def kv_csr(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int):
    """A batch's blocks as FlashInfer's CSR page description.

    Args:
        block_tables: int [B, max_num_blocks], row b's first ceil(seq_lens[b] / block_size)
            entries are sequence b's block ids (the rest is padding).
        seq_lens: int [B], each >= 1.
        block_size: tokens per block, >= 1.
    Returns:
        (indptr int32 [B + 1], indices int32 [indptr[-1]], last_block_len int32 [B]) on
        block_tables' device: sequence b's block ids are indices[indptr[b]:indptr[b + 1]], and
        its last block holds last_block_len[b] tokens, in [1, block_size].
    Raises:
        ValueError for tables that are not 2-D, lengths that are not [B] or below 1, or a table
        too narrow for its length.
    """
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r}: must be an integer >= 1")
    if block_tables.dim() != 2:
        raise ValueError(f"block_tables.shape={tuple(block_tables.shape)}: must be "
                         "[batch, max_num_blocks]")
    batch, width = block_tables.shape
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens.shape={tuple(seq_lens.shape)}: must be ({batch},), one "
                         "length per row of block_tables")
    lens = seq_lens.to("cpu", torch.int64)
    if batch and int(lens.min()) < 1:
        raise ValueError(f"seq_lens={lens.tolist()}: every length must be >= 1")
    num_blocks = (lens + block_size - 1) // block_size  # [B]
    if batch and int(num_blocks.max()) > width:
        raise ValueError(f"block_tables.shape={tuple(block_tables.shape)}: {width} blocks a row, "
                         f"but seq_lens up to {int(lens.max())} need "
                         f"{ceil_div(int(lens.max()), block_size)} of block_size={block_size}")
    device = block_tables.device
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(num_blocks, 0)
    used = torch.arange(width)[None, :] < num_blocks[:, None]  # [B, max_num_blocks]
    indices = block_tables.to("cpu", torch.int32)[used]  # row-major: sequence by sequence
    last_block_len = (lens - (num_blocks - 1) * block_size).to(torch.int32)
    return indptr.to(device), indices.to(device), last_block_len.to(device)


def unavailable_reason() -> str | None:
    """Why FlashInfer's decode cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        importlib.import_module("flashinfer")
    except ImportError as err:
        return f"flashinfer is not installed ({err}): {INSTALL}"
    return None


def unsupported(num_qo_heads: int, num_kv_heads: int, use_tensor_cores: bool) -> str | None:
    """Why FlashInfer's decode (on that path) does not take this head layout, or None. Raises
    ValueError unless both head counts are ints >= 1, num_qo_heads a multiple of num_kv_heads."""
    for name, value in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: must be an int >= 1")
    if num_qo_heads % num_kv_heads:
        raise ValueError(f"num_qo_heads={num_qo_heads}: must be a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    group = num_qo_heads // num_kv_heads
    if not use_tensor_cores and group not in CUDA_CORE_GROUPS:
        return (f"num_qo_heads / num_kv_heads = {num_qo_heads} / {num_kv_heads} = {group}: "
                f"FlashInfer's CUDA-core decode takes groups of {CUDA_CORE_GROUPS} query heads "
                "(use_tensor_cores=True takes any)")
    return None


def available() -> bool:
    return unavailable_reason() is None


def installed_version() -> str | None:
    """The flashinfer-python version installed here, or None."""
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def _flashinfer():
    try:
        return importlib.import_module("flashinfer")
    except ImportError as err:
        raise RuntimeError(f"FlashInfer's decode needs the flashinfer package: {INSTALL} "
                           f"({err})") from err


def _uniform_scale(name: str, scale: torch.Tensor) -> float:
    """FlashInfer takes one K (V) scale for all heads; kvlab keeps one per KV head."""
    values = scale.float().cpu()
    if not torch.all(values == values[0]):
        raise ValueError(f"cache.{name}={values.tolist()}: FlashInfer takes one scale for every "
                         "KV head; this fp8 cache has several")
    return float(values[0])


class FlashInferDecode:
    """FlashInfer's batch decode planned for `seq_ids` of a kvlab cache in layout "hnd".

    Args:
        cache: a kvlab PagedKVCache, layout "hnd", dtype float16, bfloat16 or float8_e4m3fn (one
            scale for all KV heads), on a CUDA device.
        seq_ids: B >= 1 live sequence ids of `cache`.
        num_qo_heads: query heads, a multiple of cache.num_kv_heads.
        use_tensor_cores: FlashInfer's tensor-core path for grouped queries (else CUDA cores).
        q_dtype: dtype of q and out: float16 or bfloat16; default the cache's (float16 for fp8).
        scale: softmax scale; default 1 / sqrt(head_dim).
        workspace_bytes: FlashInfer's float workspace, allocated here on the cache's device.
    Raises:
        ValueError for a bad argument (before anything is planned); RuntimeError when flashinfer
        is not installed.
    """

    def __init__(self, cache, seq_ids, num_qo_heads: int, *, use_tensor_cores: bool = False,
                 q_dtype=None, scale: float | None = None, workspace_bytes: int = WORKSPACE_BYTES):
        if cache.layout != "hnd":
            raise ValueError(f"cache.layout={cache.layout!r}: FlashInfer reads layout 'hnd' "
                             "([num_blocks, num_kv_heads, block_size, head_dim], its 'HND')")
        if cache.dtype not in KV_DTYPES:
            raise ValueError(f"cache.dtype={cache.dtype}: must be one of {KV_DTYPES}")
        if cache.device.type not in DEVICE_TYPES:
            raise ValueError(f"cache.device={cache.device}: must be on one of {DEVICE_TYPES}")
        if (not isinstance(num_qo_heads, int) or num_qo_heads < 1
                or num_qo_heads % cache.num_kv_heads):
            raise ValueError(f"num_qo_heads={num_qo_heads!r}: must be a positive multiple of "
                             f"num_kv_heads={cache.num_kv_heads}")
        if (why := unsupported(num_qo_heads, cache.num_kv_heads, use_tensor_cores)) is not None:
            raise ValueError(why)
        q_dtype = q_dtype or (cache.dtype if cache.dtype in Q_DTYPES else torch.float16)
        if q_dtype not in Q_DTYPES:
            raise ValueError(f"q_dtype={q_dtype}: must be one of {Q_DTYPES}")
        seq_ids = list(seq_ids)
        if not seq_ids:
            raise ValueError("seq_ids=[]: must name at least one sequence")
        self.k_scale = self.v_scale = None
        if cache.k_scale is not None:
            self.k_scale = _uniform_scale("k_scale", cache.k_scale)
            self.v_scale = _uniform_scale("v_scale", cache.v_scale)
        self.cache, self.num_qo_heads, self.q_dtype = cache, num_qo_heads, q_dtype
        self.use_tensor_cores = bool(use_tensor_cores)
        self.scale = 1 / math.sqrt(cache.head_dim) if scale is None else float(scale)
        indptr, indices, last_block_len = kv_csr(cache.block_tables(seq_ids),
                                                 cache.seq_lens(seq_ids), cache.block_size)
        self.batch = len(seq_ids)
        flashinfer = _flashinfer()
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=cache.device)
        self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, kv_layout="HND", use_tensor_cores=self.use_tensor_cores, backend=BACKEND)
        # NOTE: keywords past page_size: FlashInfer's later positional arguments have moved
        self.wrapper.plan(indptr, indices, last_block_len, num_qo_heads, cache.num_kv_heads,
                          cache.head_dim, cache.block_size, pos_encoding_mode="NONE",
                          q_data_type=q_dtype, kv_data_type=cache.dtype, sm_scale=self.scale)

    def run(self, q: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of q ([B, num_qo_heads, head_dim], q_dtype, on the cache's device) over
        each sequence's tokens: [B, num_qo_heads, head_dim] in q_dtype (into `out` if given).
        Raises ValueError for a q (or out) of another shape, dtype or device."""
        shape = (self.batch, self.num_qo_heads, self.cache.head_dim)
        for name, t in (("q", q), ("out", out)):
            if t is None:
                continue
            if tuple(t.shape) != shape or t.dtype != self.q_dtype or t.device != self.cache.device:
                raise ValueError(f"{name}: shape {tuple(t.shape)}, {t.dtype} on {t.device}: must "
                                 f"be {shape}, {self.q_dtype} on {self.cache.device}")
            if not t.is_contiguous():
                raise ValueError(f"{name}: must be contiguous")
        return self.wrapper.run(q, (self.cache.k_cache, self.cache.v_cache),
                                k_scale=self.k_scale, v_scale=self.v_scale, out=out)
