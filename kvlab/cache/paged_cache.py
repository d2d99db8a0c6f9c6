"""PagedKVCache: K and V for many sequences in fixed-size blocks of two torch tensors.

Layouts (per block; `x = 16 // itemsize`, so one x-vector is 16 bytes):
    "hnd":  k_cache, v_cache  [num_blocks, num_kv_heads, block_size, head_dim]
    "vllm": k_cache           [num_blocks, num_kv_heads, head_dim // x, block_size, x]
            v_cache           [num_blocks, num_kv_heads, head_dim, block_size]
(x = 8 for fp16/bf16, 4 for fp32, 16 for fp8.) An fp8 cache also keeps k_scale, v_scale: float32
[num_kv_heads], one scale per KV head shared by all sequences (see kvlab.cache.fp8).
"""

import math
import os

import torch

from kvlab.cache import fp8
from kvlab.cache.block_manager import Allocation, BlockManager
from kvlab.cache.block_pool import as_list
from kvlab.checks import check_block_size, check_head_dim, check_positive_int, is_int

LAYOUTS = ("hnd", "vllm")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, fp8.FP8_DTYPE)


def cache_shapes(num_blocks, block_size, num_kv_heads, head_dim, dtype, layout):
    """(k_cache shape, v_cache shape) of a paged cache. Raises ValueError for a layout not in
    LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be one of {LAYOUTS}")
    if layout == "hnd":
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        return shape, shape
    x = 16 // torch.empty((), dtype=dtype).element_size()
    return (
        (num_blocks, num_kv_heads, head_dim // x, block_size, x),
        (num_blocks, num_kv_heads, head_dim, block_size),
    )


def cache_nbytes(num_blocks, block_size, num_kv_heads, head_dim, dtype, layout) -> int:
    """Bytes of a paged cache's K and V tensors (the sizes plain ints, so that a huge count is
    sized, not allocated). Raises ValueError for a layout not in LAYOUTS."""
    k_shape, v_shape = cache_shapes(num_blocks, block_size, num_kv_heads, head_dim, dtype, layout)
    return (math.prod(k_shape) + math.prod(v_shape)) * dtype.itemsize


class PagedKVCache:
    """A paged KV cache on any torch device (one attention layer's worth of K and V).

    Args:
        num_blocks, block_size: pool size; block_size a power of two in [1, 256].
        num_kv_heads: KV heads; head_dim: one of 64, 80, 96, 112, 128, 256.
        dtype: torch.float16, torch.bfloat16, torch.float32 or torch.float8_e4m3fn (fp8, below).
        layout: "hnd" or "vllm".
        device: a torch device; the K/V tensors must fit in its free memory.
        seed: if given, blocks are handed out in a random order (scattered block tables).
        manager: a BlockManager of num_blocks blocks of block_size tokens to share (the caches
            of a model's layers share one: the engine allocates a sequence's blocks once and
            `write`s each layer's K/V into them); default a new one (seeded with `seed`).

    Raises ValueError for a bad argument, or when the K/V tensors do not fit on `device` (checked
    before allocating anything). Every method that fails raises before changing anything: the
    cache stays as it was. Writes never record autograd history, even for K/V that require grad.

    fp8 (dtype=torch.float8_e4m3fn): K/V are written from fp16, bf16 or fp32 (finite values) and
    stored as e4m3 with one float32 scale per KV head, `k_scale` and `v_scale` [num_kv_heads] on
    the cache's device. A head's scale is amax / 448 of the first write with a nonzero value for
    that head (1.0 until then) and then stays fixed, for all sequences, through fork, copy-on-write
    and free: the kernel dequantises with one multiply per head. Later values beyond 448 * scale
    are clamped (never NaN or inf); `saturated` counts the elements clamped so far, K and V
    together. `gather` returns float32, dequantised. For other dtypes k_scale, v_scale are None
    and saturated stays 0.
    """

    def __init__(self, num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.float16,
                 device="cpu", layout="hnd", seed=None, manager: BlockManager | None = None):
        check_positive_int("num_blocks", num_blocks)
        check_block_size(block_size)
        if manager is not None and (not isinstance(manager, BlockManager) or (
                manager.num_blocks, manager.block_size) != (num_blocks, block_size)):
            raise ValueError(f"manager={manager!r}: must be a BlockManager of num_blocks="
                             f"{num_blocks} blocks of block_size={block_size} tokens")
        check_positive_int("num_kv_heads", num_kv_heads)
        check_head_dim(head_dim)
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: must be one of {DTYPES}")
        num_blocks, block_size, num_kv_heads, head_dim = (
            int(num_blocks), int(block_size), int(num_kv_heads), int(head_dim)
        )
        k_shape, v_shape = cache_shapes(
            num_blocks, block_size, num_kv_heads, head_dim, dtype, layout
        )
        device = check_device(device)
        check_fits(f"num_blocks={num_blocks}: the K/V tensors",
                   cache_nbytes(num_blocks, block_size, num_kv_heads, head_dim, dtype, layout),
                   device)
        try:
            self.manager = manager or BlockManager(num_blocks, block_size, seed)
            self.k_cache = torch.zeros(k_shape, dtype=dtype, device=device)
            self.v_cache = torch.zeros(v_shape, dtype=dtype, device=device)
        except (MemoryError, RuntimeError) as err:  # torch.OutOfMemoryError is a RuntimeError
            raise ValueError(
                f"num_blocks={num_blocks}: could not allocate the K/V tensors on {device}: {err}"
            ) from err
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.layout = dtype, layout
        self.device = self.k_cache.device
        self._scales = None
        if dtype == fp8.FP8_DTYPE:
            self._scales = (fp8.FP8Scales(num_kv_heads, self.device),
                            fp8.FP8Scales(num_kv_heads, self.device))

    def __repr__(self):
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dtype={self.dtype}, "
            f"device={self.device}, layout={self.layout!r}, num_seqs={len(self.seq_ids)}, "
            f"num_free_blocks={self.num_free_blocks})"
        )

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    @property
    def seq_ids(self) -> list[int]:
        return self.manager.seq_ids

    @property
    def k_scale(self) -> torch.Tensor | None:
        """float32 [num_kv_heads] for an fp8 cache (stored K = K / k_scale), else None."""
        return None if self._scales is None else self._scales[0].scale

    @property
    def v_scale(self) -> torch.Tensor | None:
        """float32 [num_kv_heads] for an fp8 cache (stored V = V / v_scale), else None."""
        return None if self._scales is None else self._scales[1].scale

    @property
    def saturated(self) -> int:
        """Elements of K and V clamped to +-448 * scale so far (fp8 caches; else 0)."""
        return 0 if self._scales is None else sum(s.saturated for s in self._scales)

    @property
    def nbytes(self) -> int:
        return self.k_cache.nbytes + self.v_cache.nbytes

    def add_sequence(self, k, v, token_ids=None) -> int:
        """Store a new sequence. k, v: [seq_len, num_kv_heads, head_dim] in the cache's dtype (for
        an fp8 cache: fp16, bf16 or fp32) and device, seq_len >= 1. token_ids (seq_len ints), if
        given, let full blocks be shared with live sequences of equal prefix; their K/V is then
        taken to be equal and not rewritten.
        Returns the new seq_id. Raises ValueError on bad input, OutOfBlocksError when full."""
        self._check_kv(k, v)
        if k.shape[0] == 0:
            raise ValueError("k has 0 tokens: a sequence needs at least one token")
        return self._write(self.manager.add_sequence(k.shape[0], token_ids), k, v)

    def append(self, seq_id: int, k, v, token_ids=None) -> None:
        """Append n tokens to a sequence. k, v: [n, num_kv_heads, head_dim], n >= 0."""
        self._check_kv(k, v)
        self._write(self.manager.append(seq_id, k.shape[0], token_ids), k, v)

    def write(self, alloc: Allocation, k, v) -> None:
        """Write the K/V of tokens the (shared) manager has already placed: `alloc` is what its
        add_sequence or append returned for them, k, v the K/V of those n tokens (the sequence's
        last n), as `append` takes them. Copy-on-write copies and a shared prefix are handled as
        `add_sequence` and `append` handle them."""
        if not isinstance(alloc, Allocation):
            raise ValueError(f"alloc={alloc!r:.60}: must be an Allocation (what the manager's "
                             "add_sequence or append returned)")
        self._check_kv(k, v)
        seq_len = self.manager.seq_len(alloc.seq_id)
        if k.shape[0] > seq_len:
            raise ValueError(f"k has {k.shape[0]} tokens: sequence {alloc.seq_id} holds {seq_len}")
        if k.shape[0] < seq_len - alloc.write_start:
            raise ValueError(f"k has {k.shape[0]} tokens: sequence {alloc.seq_id}'s positions "
                             f"{alloc.write_start} to {seq_len - 1} must be written, its last "
                             f"{seq_len - alloc.write_start} tokens")
        self._write(alloc, k, v)

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing all of `seq_id`'s blocks (copy-on-write). Returns its seq_id."""
        return self.manager.fork(seq_id)

    def free(self, seq_id: int) -> None:
        self.manager.free(seq_id)

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense copies (k, v) of a sequence, each [seq_len, num_kv_heads, head_dim], in the
        cache's dtype; float32 (dequantised) for an fp8 cache."""
        seq_len = self.manager.seq_len(seq_id)
        k, v = self._read(self.manager.slot_mapping(seq_id, 0, seq_len))
        if self._scales is None:
            return k, v
        return (fp8.dequantize(k, self.k_scale, head_axis=1),
                fp8.dequantize(v, self.v_scale, head_axis=1))

    def block_tables(self, seq_ids) -> torch.Tensor:
        """int32 [len(seq_ids), max_num_blocks] on the cache's device. Rows are padded with 0
        (a valid block id, so that an over-read stays in bounds): use seq_lens to bound them."""
        seq_ids = as_list("seq_ids", seq_ids, "a sequence of seq ids")
        tables = [self.manager.block_table(s) for s in seq_ids]
        width = max((len(t) for t in tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(padded, dtype=torch.int32, device=self.device).view(len(tables), width)

    def seq_lens(self, seq_ids) -> torch.Tensor:
        """int32 [len(seq_ids)] on the cache's device."""
        seq_ids = as_list("seq_ids", seq_ids, "a sequence of seq ids")
        lens = [self.manager.seq_len(s) for s in seq_ids]
        return torch.tensor(lens, dtype=torch.int32, device=self.device)

    def _check_kv(self, k, v) -> None:
        expected = (self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3 or tuple(t.shape[1:]) != expected:
                raise ValueError(
                    f"{name}.shape={tuple(t.shape)}: must be [n, num_kv_heads={expected[0]}, "
                    f"head_dim={expected[1]}]"
                )
            if self._scales is not None:
                fp8.check_source(name, t)
            elif t.dtype != self.dtype:
                raise ValueError(f"{name}.dtype={t.dtype}: must be the cache's {self.dtype}")
            if t.device != self.device:
                raise ValueError(f"{name}.device={t.device}: must be the cache's {self.device}")
        if k.shape != v.shape:
            raise ValueError(f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}: must match")

    @torch.no_grad()
    def copy_blocks(self, copies) -> None:
        """Copy whole blocks, (src_block_id, dst_block_id) pairs: an Allocation's copy-on-write
        `copies`, for a caller that places tokens with a shared manager and writes them with
        `write_slots`. Raises ValueError, before copying any, for a pair that is not two block
        ids."""
        if not copies:  # NOTE: a decode step calls this for every layer, nearly always with none
            return
        try:
            copies = tuple(copies)
        except TypeError:
            raise ValueError(f"copies={copies!r:.60}: must be a sequence of (src_block_id, "
                             "dst_block_id) pairs") from None
        for i, pair in enumerate(copies):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                    and all(is_int(b) and 0 <= b < self.num_blocks for b in pair)):
                raise ValueError(f"copies[{i}]={pair!r}: must be a (src_block_id, dst_block_id) "
                                 f"pair of block ids, integers in [0, {self.num_blocks})")
        for src, dst in copies:
            self.k_cache[dst] = self.k_cache[src]
            self.v_cache[dst] = self.v_cache[src]

    @torch.no_grad()
    def write_slots(self, slots: torch.Tensor, k, v) -> None:
        """Write the K/V of n tokens at cache slots `slots` (int64 [n] on the cache's device:
        block id * block_size + offset in the block, as BlockManager.slot_mapping gives them).
        k, v: [n, num_kv_heads, head_dim] as `append` takes them. No block bookkeeping: for a
        caller that has placed the tokens with a shared manager (one placement, many layers'
        caches) and applied its copies with `copy_blocks`. Raises ValueError for a slot outside
        the cache (checked with one device sync, except while a CUDA graph is being captured)."""
        self._check_kv(k, v)
        if not isinstance(slots, torch.Tensor):
            raise ValueError(f"slots={slots!r:.60}: must be an int64 tensor [{k.shape[0]}] on "
                             f"{self.device} (one per token)")
        if slots.shape != (k.shape[0],) or slots.dtype != torch.int64 or (
                slots.device != self.device):
            raise ValueError(f"slots: int64 [{k.shape[0]}] on {self.device} (one per token), "
                             f"got {slots.dtype} {tuple(slots.shape)} on {slots.device}")
        num_slots = self.num_blocks * self.block_size
        if slots.numel() and not (self.device.type == "cuda"
                                  and torch.cuda.is_current_stream_capturing()):
            lo, hi = (int(x) for x in slots.aminmax())
            if lo < 0 or hi >= num_slots:
                bad = lo if lo < 0 else hi
                raise ValueError(f"slots: holds {bad}, must be in [0, num_blocks x block_size = "
                                 f"{num_slots})")
        self._quantize_scatter(slots, k, v)

    @torch.no_grad()  # NOTE: K/V that require grad must not pull the cache into autograd.
    def _write(self, alloc: Allocation, k, v) -> int:
        self.copy_blocks(alloc.copies)
        seq_len = self.manager.seq_len(alloc.seq_id)
        first = alloc.write_start - (seq_len - k.shape[0])  # index into k of the first new token
        if alloc.write_start < seq_len:
            slots = self.manager.slot_mapping(alloc.seq_id, alloc.write_start, seq_len)
            slots = torch.tensor(slots, dtype=torch.int64, device=self.device)
            self._quantize_scatter(slots, k[first:], v[first:])
        return alloc.seq_id

    def _quantize_scatter(self, slots: torch.Tensor, k, v) -> None:
        if self._scales is not None:  # scales from the tokens written, not a shared prefix
            k, v = self._scales[0].quantize(k), self._scales[1].quantize(v)
        self._scatter(slots, k, v)

    def _block_offset(self, slots) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(slots, torch.Tensor):
            slots = torch.tensor(slots, dtype=torch.int64, device=self.device)
        return slots // self.block_size, slots % self.block_size

    def _scatter(self, slots: torch.Tensor, k, v) -> None:
        block, offset = self._block_offset(slots)
        if self.layout == "hnd":
            self.k_cache[block, :, offset] = k
            self.v_cache[block, :, offset] = v
        else:
            x = self.k_cache.shape[-1]
            self.k_cache[block, :, :, offset] = k.reshape(len(slots), self.num_kv_heads, -1, x)
            self.v_cache[block, :, :, offset] = v

    def _read(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        block, offset = self._block_offset(slots)
        if self.layout == "hnd":
            return self.k_cache[block, :, offset], self.v_cache[block, :, offset]
        k = self.k_cache[block, :, :, offset].reshape(len(slots), self.num_kv_heads, self.head_dim)
        return k, self.v_cache[block, :, :, offset]


def check_device(device) -> torch.device:
    """`device` as a torch.device. Raises ValueError, naming it, for what is not a device, or a
    CUDA device that is not there."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device={device!r}: must be a torch device, e.g. 'cpu' or 'cuda:0'"
        ) from err
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(
            f"device={device}: no such CUDA device ({torch.cuda.device_count()} visible)"
        )
    return device


def _free_bytes(device: torch.device) -> int | None:
    """Bytes that an allocation on `device` can take now, where that is known: on a GPU the
    driver's free memory once torch's caching allocator has handed back every segment it holds
    unused (a free block inside a segment that also holds a live tensor stays with the
    allocator and is not counted: such blocks are pieces, maybe each too small for the tensor
    asked for); on the CPU MemAvailable (free memory and page cache the kernel can drop)."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        if "SC_AVPHYS_PAGES" in getattr(os, "sysconf_names", {}):
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


class DoesNotFit(ValueError):
    """`check_fits`'s refusal: what an argument sizes needs more than the device has free."""


def check_fits(what: str, num_bytes: int, device: torch.device) -> None:
    """DoesNotFit (a ValueError) unless `num_bytes` fit in the free memory of `device` (where
    that is known). what: the argument and the tensors it sizes, e.g. "num_blocks=8: the K/V
    tensors"."""
    num_free = _free_bytes(device)
    if num_free is not None and num_bytes > num_free:
        raise DoesNotFit(f"{what} need {num_bytes:,} bytes, but {device} has {num_free:,} bytes "
                         "free")
