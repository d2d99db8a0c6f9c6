"""Launchers for `kernels/layer_ops.cu`: a decoder layer's small decode-step ops as one CUDA
kernel each (RMSNorm with its residual add, RoPE from a cos/sin table, the paged-cache write,
SwiGLU's product, and RoPE of Q and K with the cache write together), where torch composes them
from several; the linear layers of a step of at most LINEAR_ROWS rows, whose weights it
streams in less time than cuBLAS over the paper models' linears (not at every shape:
docs/kernels/layer_ops.md has the figures), with the residual add or SwiGLU's product that follows
them in the same launch, and optionally the next kernel's first operand bytes, or the K and V
blocks the attention after it reads, brought into L2 as the grid drains (the cross-kernel
prefetch, `ahead` and `kv_ahead`); and greedy sampling's argmax over the logits in their own
dtype.

The layer code (`kvlab.model`, `kvlab.engine.forward`) and the engine's sampling
(`kvlab.engine.runner`) call these where `usable` says so: fp16 or bf16 tensors on a CUDA device,
with CuPy present. Elsewhere they run torch ops, which these equal to the dtype's precision
(checked by tests/kernels/test_layer_ops.py on a GPU). Every launcher checks its tensors before
launching.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from kvlab.arith import ceil_div
from kvlab.checks import check_real, is_int
from kvlab.kernels.launch import NULL, launch, ptr, resident_ctas
from kvlab.kernels.vllm_v1 import CUDA_TYPES

SOURCE = "layer_ops.cu"
VEC = 8  # elements of a 16-byte vector
ROPE_THREADS = 128
MAX_THREADS = 1024
ARGMAX_THREADS = 1024
NORM_VECS = (1, 2, 4)  # vectors per thread the rms_norm instantiations keep in registers
LINEAR_ROWS = 2  # the most rows `linear` takes (one instantiation per count)
# weight rows a CTA owns, 16-byte loads of each a lane has in flight, and warps a CTA (at most
# the kernel's LINEAR_MAX_WARPS, 8)
LINEAR_COLS, LINEAR_UNROLL, LINEAR_WARPS = 4, 2, 4
# what `linear` writes (the kernel's EPILOGUE): F.linear's output, plus a residual, or SwiGLU's
# product of its two halves
LINEAR_EPILOGUES = {"plain": "kvlab::LINEAR_PLAIN", "residual": "kvlab::LINEAR_RESIDUAL",
                    "swiglu": "kvlab::LINEAR_SWIGLU"}


@functools.cache
def _cupy_present() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


def usable(*tensors: torch.Tensor) -> bool:
    """Whether these kernels can take the tensors: fp16 or bf16, on a CUDA device, CuPy
    importable."""
    return all(t.is_cuda and t.dtype in CUDA_TYPES for t in tensors) and _cupy_present()


def default_instances() -> list[str]:
    """Every instantiation the launchers use (CI compiles them all with nvcc)."""
    names = []
    for t in CUDA_TYPES.values():
        names += [f"kvlab::rms_norm<{t}, {vecs}>" for vecs in NORM_VECS]
        names += [f"kvlab::rope<{t}>", f"kvlab::silu_mul<{t}>"]
        names += [f"kvlab::{op}<{t}, {layout}>" for op in ("write_kv", "rope_write")
                  for layout in ("false", "true")]
        for rows in range(1, LINEAR_ROWS + 1):
            names += [linear_name(t, rows, epilogue, norm) for epilogue in LINEAR_EPILOGUES
                      for norm in (False, True) if not (norm and epilogue == "residual")]
            names += [linear_rope_write_name(t, rows, layout) for layout in ("hnd", "vllm")]
        names.append(f"kvlab::argmax<{t}>")
    return names


def _flag(value: bool) -> str:
    return str(bool(value)).lower()


def linear_name(cuda_type: str, rows: int, epilogue: str, norm: bool = False) -> str:
    return (f"kvlab::linear<{cuda_type}, {rows}, {LINEAR_COLS}, {LINEAR_UNROLL}, "
            f"{LINEAR_EPILOGUES[epilogue]}, {_flag(norm)}>")


def linear_rope_write_name(cuda_type: str, rows: int, layout: str) -> str:
    return (f"kvlab::linear_rope_write<{cuda_type}, {rows}, {LINEAR_COLS}, {LINEAR_UNROLL}, "
            f"{_flag(layout == 'vllm')}>")


@functools.cache
def _kernels(device_index: int) -> dict:
    from kvlab.kernels.loader import load

    names = default_instances()  # few and small: compiled together on first use
    return dict(zip(names, load(SOURCE, names, device_index), strict=True))


def _kernel(name: str, device: torch.device):
    return _kernels(device.index)[name]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _rows_problem(t: torch.Tensor, name: str, width: int) -> str | None:
    """Why t is not [rows, width] with contiguous, 16-byte aligned rows, width a multiple of
    VEC; None where it is."""
    if (t.dim() == 2 and t.shape[1] == width and t.stride(1) == 1 and t.stride(0) % VEC == 0
            and t.data_ptr() % 16 == 0 and width % VEC == 0):
        return None
    return (f"{name}: {t.dtype} {tuple(t.shape)} strides {t.stride()}: must be [rows, {width}] "
            f"with contiguous, 16-byte aligned rows ({VEC} | {width})")


def _rows_of(t: torch.Tensor, name: str, width: int) -> None:
    problem = _rows_problem(t, name, width)
    _check(problem is None, problem)


def same_kind(*tensors: torch.Tensor) -> bool:
    """One dtype (fp16 or bf16), one CUDA device, CuPy importable."""
    return (usable(*tensors) and len({t.dtype for t in tensors}) == 1
            and len({t.device for t in tensors}) == 1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, *, ahead: torch.Tensor | None = None,
             ahead_bytes: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(normed, h): h = x + residual (rounded to x's dtype; x itself when residual is None) and
    normed = weight * RMSNorm(h), as HF's LlamaRMSNorm rounds it. x, residual: [rows, hidden]
    contiguous; weight [hidden]; eps in (0, 1], as a ModelConfig's norm_eps. ahead,
    ahead_bytes: the cross-kernel prefetch (`linear`'s), by every CTA as the kernel starts.
    ValueError for what the kernel does not take, before anything is allocated."""
    check_real("eps", eps, 0, 1, open_min=True)
    _check((problem := ahead_problem(ahead, ahead_bytes, x.device)) is None, problem)
    _check(x.dim() == 2, f"x: shape {tuple(x.shape)}, must be [rows, hidden]")
    rows, hidden = x.shape
    for name, t in (("x", x), ("residual", residual)):
        if t is not None:
            _check(t.is_contiguous(), f"{name}: must be contiguous")
            _rows_of(t, name, hidden)
    _check(weight.shape == (hidden,) and weight.is_contiguous(),
           f"weight: shape {tuple(weight.shape)}, must be ({hidden},) and contiguous")
    _check(same_kind(x, weight, *([] if residual is None else [residual])),
           "x, weight and residual: one dtype (fp16 or bf16) on one CUDA device")
    threads = min(MAX_THREADS, ceil_div(ceil_div(hidden, VEC), 32) * 32)
    vecs = next((v for v in NORM_VECS if v * VEC * threads >= hidden), None)
    _check(vecs is not None, f"hidden={hidden}: at most {NORM_VECS[-1] * VEC * MAX_THREADS}")
    normed = torch.empty_like(x)
    total = x if residual is None else torch.empty_like(x)
    if rows:
        launch(_kernel(f"kvlab::rms_norm<{CUDA_TYPES[x.dtype]}, {vecs}>", x.device), (rows,),
               (threads,), (ptr(normed), ptr(total), ptr(x), ptr(residual), ptr(weight),
                            np.float32(eps), np.int32(hidden), *_ahead_args(ahead, ahead_bytes)),
               x.device)
    return normed, total


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         positions: torch.Tensor) -> torch.Tensor:
    """x [rows, heads, head_dim] (rows of any stride, heads and elements contiguous: a view
    into a fused QKV output will do) rotated at `positions` [rows] (int64) by the tables cos,
    sin [max_positions, head_dim]: a new contiguous tensor. A position outside the tables
    (which RopeTable makes for the model's whole context) gives a row of zeros."""
    _check(x.dim() == 3, f"x: shape {tuple(x.shape)}, must be [rows, heads, head_dim]")
    rows, heads, head_dim = x.shape
    _check(x.stride(2) == 1 and x.stride(1) == head_dim and head_dim % 2 == 0,
           f"x: shape {tuple(x.shape)} strides {x.stride()}: heads and elements contiguous")
    _check(cos.shape == sin.shape and cos.dim() == 2 and cos.shape[1] == head_dim
           and cos.is_contiguous() and sin.is_contiguous(),
           f"cos, sin: {tuple(cos.shape)}, {tuple(sin.shape)}: must be contiguous "
           f"[max_positions, {head_dim}]")
    _check(positions.shape == (rows,) and positions.dtype == torch.int64
           and positions.device == x.device,
           f"positions: must be int64 [{rows}] on {x.device}")
    _check(same_kind(x, cos, sin), "x, cos, sin: one dtype (fp16 or bf16) on one CUDA device")
    out = torch.empty(rows, heads, head_dim, dtype=x.dtype, device=x.device)
    if rows:
        pairs = heads * head_dim // 2
        launch(_kernel(f"kvlab::rope<{CUDA_TYPES[x.dtype]}>", x.device),
               (rows, ceil_div(pairs, ROPE_THREADS)), (ROPE_THREADS,),
               (ptr(out), ptr(x), ptr(cos), ptr(sin), ptr(positions), np.int64(cos.shape[0]),
                np.int32(heads), np.int32(head_dim), np.int64(x.stride(0)),
                np.int64(out.stride(0))), x.device)
    return out


def write_kv(cache, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """`cache.write_slots(slots, k, v)` in one kernel: k, v [n, num_kv_heads, head_dim] (rows
    of any stride) into a PagedKVCache of fp16 or bf16, either layout, at int64 `slots` [n].
    Slots outside the cache are skipped (the caller's manager gives valid ones)."""
    _check(k.dim() == 3, f"k: shape {tuple(k.shape)}, must be [n, num_kv_heads, head_dim]")
    n, heads, head_dim = k.shape
    _check(v.shape == k.shape and heads == cache.num_kv_heads and head_dim == cache.head_dim,
           f"k, v: {tuple(k.shape)}, {tuple(v.shape)}: must both be [n, {cache.num_kv_heads}, "
           f"{cache.head_dim}]")
    for name, t in (("k", k), ("v", v)):
        _check(t.stride(2) == 1 and t.stride(1) == head_dim and t.stride(0) % VEC == 0
               and t.data_ptr() % 16 == 0,
               f"{name}: strides {t.stride()}: heads and elements contiguous, rows 16-byte "
               "aligned")
    _check(slots.shape == (n,) and slots.dtype == torch.int64 and slots.device == cache.device,
           f"slots: must be int64 [{n}] on {cache.device}")
    _check(same_kind(k, v, cache.k_cache),
           f"k, v: {k.dtype}, {v.dtype}: must be the cache's dtype ({cache.dtype}), fp16 or "
           "bf16, on its CUDA device")
    if n:
        name = f"kvlab::write_kv<{CUDA_TYPES[k.dtype]}, {str(cache.layout == 'vllm').lower()}>"
        launch(_kernel(name, k.device), (n,), (min(MAX_THREADS, heads * head_dim // VEC),),
               (ptr(cache.k_cache), ptr(cache.v_cache), ptr(k), ptr(v), ptr(slots),
                np.int64(cache.num_blocks), np.int32(cache.block_size), np.int32(heads),
                np.int32(head_dim), np.int64(k.stride(0)), np.int64(v.stride(0))), k.device)


def _check_rope_write(num_qo_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                      positions: torch.Tensor, cache, slots: torch.Tensor, n: int,
                      device: torch.device) -> int:
    """Check rope_write's arguments but the QKV output (of n rows on `device`); its width."""
    heads, head_dim = cache.num_kv_heads, cache.head_dim
    _check(is_int(num_qo_heads) and num_qo_heads >= 1,
           f"num_qo_heads={num_qo_heads!r}: must be a positive integer")
    _check(cos.dim() == 2 and cos.shape == sin.shape == (cos.shape[0], head_dim)
           and cos.is_contiguous() and sin.is_contiguous(),
           f"cos, sin: {tuple(cos.shape)}, {tuple(sin.shape)}: must be contiguous "
           f"[max_positions, {head_dim}]")
    for name, t in (("positions", positions), ("slots", slots)):
        _check(t.shape == (n,) and t.dtype == torch.int64 and t.device == device,
               f"{name}: must be int64 [{n}] on {device}")
    return (num_qo_heads + 2 * heads) * head_dim


def _rope_write_args(q: torch.Tensor, num_qo_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor, cache, slots: torch.Tensor) -> tuple:
    """The kernels' RopeWrite arguments: Q into q, K and V into `cache`."""
    return (ptr(q), ptr(cache.k_cache), ptr(cache.v_cache), ptr(cos), ptr(sin), ptr(positions),
            np.int64(cos.shape[0]), ptr(slots), np.int64(cache.num_blocks),
            np.int32(cache.block_size), np.int32(num_qo_heads), np.int32(cache.num_kv_heads),
            np.int32(cache.head_dim))


def rope_write(qkv: torch.Tensor, num_qo_heads: int, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor, cache, slots: torch.Tensor) -> torch.Tensor:
    """A RoPE layer's QKV output of n new tokens into attention, in one kernel: returns Q
    rotated at `positions` (`rope`), a new contiguous [n, num_qo_heads, head_dim], and writes
    K rotated and V into a PagedKVCache of fp16 or bf16, either layout, at `slots`
    (`write_kv`). qkv: [n, (num_qo_heads + 2 num_kv_heads) * head_dim], the Q, K, V heads in
    turn (the fused QKV GEMM's output), rows of any stride; positions, slots: int64 [n]."""
    _check(qkv.dim() == 2, f"qkv: shape {tuple(qkv.shape)}, must be [n, (num_qo_heads + 2 "
           "num_kv_heads) * head_dim]")
    n = qkv.shape[0]
    width = _check_rope_write(num_qo_heads, cos, sin, positions, cache, slots, n, qkv.device)
    _check(qkv.shape[1] == width and qkv.stride(1) == 1,
           f"qkv: shape {tuple(qkv.shape)} strides {qkv.stride()}: must be [n, {width}] "
           f"((num_qo_heads={num_qo_heads} + 2 x {cache.num_kv_heads}) x {cache.head_dim}), "
           "elements contiguous")
    _check(same_kind(qkv, cos, sin, cache.k_cache),
           f"qkv, cos, sin: {qkv.dtype}, {cos.dtype}, {sin.dtype}: must be the cache's dtype "
           f"({cache.dtype}), fp16 or bf16, on its CUDA device")
    q = torch.empty(n, num_qo_heads, cache.head_dim, dtype=qkv.dtype, device=qkv.device)
    if n:
        name = (f"kvlab::rope_write<{CUDA_TYPES[qkv.dtype]}, "
                f"{str(cache.layout == 'vllm').lower()}>")
        launch(_kernel(name, qkv.device), (n, ceil_div(width // 2, ROPE_THREADS)),
               (ROPE_THREADS,), (ptr(qkv), np.int64(qkv.stride(0)),
                                 *_rope_write_args(q, num_qo_heads, cos, sin, positions, cache,
                                                   slots)), qkv.device)
    return q


def silu_mul(gate_up: torch.Tensor, *, ahead: torch.Tensor | None = None,
             ahead_bytes: int = 0) -> torch.Tensor:
    """SwiGLU's product silu(gate) * up of gate_up [rows, 2 n] (gate then up in each row, one
    GEMM's output; contiguous): [rows, n], as torch's F.silu(gate) * up rounds it. ahead,
    ahead_bytes: the cross-kernel prefetch (`linear`'s), by every CTA as the kernel starts."""
    _check((problem := ahead_problem(ahead, ahead_bytes, gate_up.device)) is None, problem)
    _check(gate_up.dim() == 2, f"gate_up: shape {tuple(gate_up.shape)}, must be [rows, 2 n]")
    rows, width = gate_up.shape
    _check(gate_up.is_contiguous() and width % (2 * VEC) == 0,
           f"gate_up: shape {tuple(gate_up.shape)}: must be contiguous [rows, 2 n], "
           f"{VEC} | n")
    _check(usable(gate_up), "gate_up: fp16 or bf16 on a CUDA device")
    n = width // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        threads = 256
        launch(_kernel(f"kvlab::silu_mul<{CUDA_TYPES[gate_up.dtype]}>", gate_up.device),
               (rows, ceil_div(ceil_div(n, VEC), threads)), (threads,),
               (ptr(out), ptr(gate_up), np.int32(n), *_ahead_args(ahead, ahead_bytes)),
               gate_up.device)
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """int64 [rows] on x's device: the column of the largest element of each row of x [rows,
    cols] (fp16 or bf16, contiguous along a row, cols >= 1), as torch.argmax(x, dim=-1) picks
    it (the first of equal ones; NaN above every number). Greedy sampling's step."""
    _check(x.dim() == 2 and x.shape[1] >= 1 and x.stride(1) == 1,
           f"x: shape {tuple(x.shape)} strides {x.stride()}, must be [rows, cols] with cols >= 1, "
           "contiguous along a row")
    _check(usable(x), "x: fp16 or bf16 on a CUDA device")
    rows, cols = x.shape
    _check(cols <= 2**31 - 1 - ARGMAX_THREADS,  # the kernel's column index stays an int
           f"x: {cols} columns, must be at most 2**31 - 1 - {ARGMAX_THREADS}")
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        aligned = x.data_ptr() % 16 == 0 and x.stride(0) % VEC == 0
        launch(_kernel(f"kvlab::argmax<{CUDA_TYPES[x.dtype]}>", x.device), (rows,),
               (ARGMAX_THREADS,), (ptr(out), ptr(x), np.int32(cols),
                                   np.int32(cols // VEC * VEC if aligned else 0),
                                   np.int64(x.stride(0))), x.device)
    return out


def linear_problem(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   residual: torch.Tensor | None = None, swiglu: bool = False,
                   norm: RmsNorm | None = None) -> str | None:
    """Why `linear` would refuse these arguments, or None where it takes them."""
    if x.dim() != 2 or not 1 <= x.shape[0] <= LINEAR_ROWS:
        return f"x: shape {tuple(x.shape)}, must be [rows, k] with 1 <= rows <= {LINEAR_ROWS}"
    (rows, k), extra = x.shape, [t for t in (bias, residual) if t is not None]
    if norm is not None:
        if (problem := _norm_problem(norm, k)) is not None:
            return problem
        if residual is not None:
            return "norm and residual: a linear takes one or the other"
        extra.append(norm.weight)
    if (problem := _rows_problem(x, "x", k)) is not None:
        return problem
    if not (weight.dim() == 2 and weight.shape[1] == k and weight.is_contiguous()
            and weight.data_ptr() % 16 == 0):
        return f"weight: shape {tuple(weight.shape)}, must be contiguous [n, {k}], 16-byte aligned"
    n = weight.shape[0]
    if bias is not None and not (bias.shape == (n,) and bias.is_contiguous()):
        return f"bias: shape {tuple(bias.shape)}, must be ({n},) and contiguous, or None"
    if swiglu and (residual is not None or n % 2):
        return (f"swiglu: weight shape {tuple(weight.shape)}, residual "
                f"{None if residual is None else tuple(residual.shape)}: takes gate and up "
                "rows stacked (an even n) and no residual")
    if residual is not None and not (residual.shape == (rows, n) and residual.is_contiguous()):
        return (f"residual: shape {tuple(residual.shape)}, must be ({rows}, {n}) and "
                "contiguous, or None")
    if not same_kind(x, weight, *extra):
        return ("x, weight, bias, residual and the norm's weight: one dtype (fp16 or bf16) on one "
                "CUDA device")
    if max(n, k) >= 2**31:
        return f"weight: shape {tuple(weight.shape)}, each side must be below 2**31"
    return None


@dataclass(frozen=True)
class RmsNorm:
    """An RMSNorm that `linear` folds into its input: it takes weight * RMSNorm(x) for its x
    (HF's LlamaRMSNorm of epsilon eps; weight [k], contiguous, 16-byte aligned), in fp32 from
    the sums it makes anyway, so that the normed x never reaches memory."""

    weight: torch.Tensor
    eps: float


def _norm_problem(norm, k: int) -> str | None:
    if not isinstance(norm, RmsNorm):
        return f"norm: a {type(norm).__name__}, must be a layer_ops.RmsNorm or None"
    w = norm.weight
    if not (isinstance(w, torch.Tensor) and w.shape == (k,) and w.is_contiguous()
            and w.data_ptr() % 16 == 0):
        return (f"norm.weight: shape {tuple(getattr(w, 'shape', ()))}, must be ({k},), "
                "contiguous and 16-byte aligned")
    try:
        check_real("norm.eps", norm.eps, 0, 1, open_min=True)
    except ValueError as e:
        return str(e)
    return None


def ahead_problem(ahead: torch.Tensor | None, ahead_bytes, device: torch.device) -> str | None:
    """Why `linear` would refuse this cross-kernel prefetch, or None where it takes it."""
    if not is_int(ahead_bytes) or ahead_bytes < 0:
        return f"ahead_bytes={ahead_bytes!r}: must be an integer >= 0"
    if ahead is None or ahead_bytes == 0:
        return None
    if not (isinstance(ahead, torch.Tensor) and ahead.device == device
            and ahead.is_contiguous() and ahead.data_ptr() % 16 == 0):
        return (f"ahead: must be a contiguous, 16-byte aligned tensor on {device} (the next "
                "kernel's operand), or None")
    return None


@dataclass(frozen=True)
class PagedAhead:
    """The K and V blocks of one layer's paged cache that `linear` brings into L2 for the
    attention after it: the blocks of each row of `block_tables` (int32 [rows, cols]) that hold
    its `seq_lens` (int32 [rows]) tokens, `block_size` a block, a block of every row in turn (the
    rows' first blocks first), at most `nbytes` of K and V together. k_cache, v_cache: [num_blocks,
    ...] contiguous, a block the same bytes in both (any of kvlab.cache's layouts). The tables and
    lengths are read when the kernel runs (a CUDA graph's buffers may change between replays)."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    block_size: int
    nbytes: int

    @property
    def block_bytes(self) -> int:
        """The bytes of one block of K (as of V)."""
        return self.k_cache[0].numel() * self.k_cache.element_size()

    @property
    def pairs(self) -> int:
        """The (K block, V block) pairs the kernel prefetches at most: nbytes' worth, at most
        one per entry of the tables."""
        return min(self.nbytes // (2 * self.block_bytes), self.block_tables.numel())


def paged_ahead_problem(kv: PagedAhead | None, device: torch.device) -> str | None:
    """Why `linear` would refuse this prefetch of K/V blocks, or None where it takes it."""
    if kv is None:
        return None
    if not isinstance(kv, PagedAhead):
        return f"kv_ahead: a {type(kv).__name__}, must be a layer_ops.PagedAhead or None"
    if not is_int(kv.nbytes) or kv.nbytes < 0:
        return f"kv_ahead.nbytes={kv.nbytes!r}: must be an integer >= 0"
    if not is_int(kv.block_size) or not 1 <= kv.block_size < 2**31:
        return f"kv_ahead.block_size={kv.block_size!r}: must be an integer in [1, 2**31)"
    k, v, tables, lens = kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens
    if not all(isinstance(t, torch.Tensor) and t.device == device and t.is_contiguous()
               for t in (k, v, tables, lens)):
        return (f"kv_ahead: k_cache, v_cache, block_tables and seq_lens must be contiguous "
                f"tensors on {device}")
    if not (k.dim() >= 2 and v.dim() >= 2 and k.shape[0] == v.shape[0] >= 1
            and k.dtype == v.dtype and k[0].numel() == v[0].numel() >= 1
            and kv.block_bytes % 16 == 0 and k.data_ptr() % 16 == 0 and v.data_ptr() % 16 == 0):
        return (f"kv_ahead: k_cache {tuple(k.shape)} and v_cache {tuple(v.shape)} must be "
                "[num_blocks >= 1, ...] of one dtype, a block the same multiple of 16 bytes "
                "(> 0) in both, 16-byte aligned")
    if not (tables.dim() == 2 and tables.dtype == torch.int32 and lens.dtype == torch.int32
            and lens.shape == (tables.shape[0],)):
        return (f"kv_ahead: block_tables {tuple(tables.shape)} {tables.dtype} and seq_lens "
                f"{tuple(lens.shape)} {lens.dtype} must be int32 [rows, cols] and [rows]")
    if max(k.shape[0], *tables.shape) >= 2**31:
        return f"kv_ahead: {k.shape[0]} blocks, tables {tuple(tables.shape)}: each below 2**31"
    return None


def _paged_args(kv: PagedAhead | None) -> tuple:
    """linear's kv_* arguments: `kv`'s blocks, or none."""
    if kv is None or kv.pairs == 0:
        return (NULL,) * 4 + (np.int32(0),) * 4 + (np.int64(0), np.int64(0))
    rows, cols = kv.block_tables.shape
    return (ptr(kv.k_cache), ptr(kv.v_cache), ptr(kv.block_tables), ptr(kv.seq_lens),
            np.int32(rows), np.int32(cols), np.int32(kv.block_size),
            np.int32(kv.k_cache.shape[0]), np.int64(kv.block_bytes), np.int64(kv.pairs))


def ahead_span(ahead: torch.Tensor | None, ahead_bytes: int) -> int:
    """The bytes of `ahead` that `linear` prefetches: its first ahead_bytes, at most all of it,
    rounded down to the bulk prefetch's 16-byte granule (0 without `ahead`)."""
    if ahead is None:
        return 0
    return min(int(ahead_bytes), ahead.numel() * ahead.element_size()) // 16 * 16


def _ahead_args(ahead: torch.Tensor | None, ahead_bytes: int) -> tuple:
    """A kernel's (ahead, ahead_bytes) arguments: `ahead_span` bytes at ahead, or none."""
    span = ahead_span(ahead, ahead_bytes)
    return ptr(ahead if span else None), np.int64(span)


def _norm_args(norm: RmsNorm | None) -> tuple:
    """The kernels' (norm_weight, norm_eps) arguments."""
    return (NULL, np.float32(0)) if norm is None else (ptr(norm.weight), np.float32(norm.eps))


def _linear_ahead_args(name: str, grid: int, device: torch.device, ahead: torch.Tensor | None,
                       ahead_bytes: int, kv_ahead: PagedAhead | None) -> tuple:
    """A linear kernel's cross-kernel prefetch arguments (its LINEAR_AHEAD_PARAMS): the bytes
    ahead, how many CTAs at the grid's end prefetch (its last wave, none without a prefetch),
    and the K/V blocks."""
    prefetching = ahead_span(ahead, ahead_bytes) or (kv_ahead is not None and kv_ahead.pairs)
    tail = min(grid, _wave(name, device.index)) if prefetching else 0
    return *_ahead_args(ahead, ahead_bytes), np.int32(tail), *_paged_args(kv_ahead)


@functools.cache
def _wave(name: str, device_index: int) -> int:
    """CTAs of `linear` instantiation `name` that the whole GPU holds at once."""
    device = torch.device("cuda", device_index)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * resident_ctas(_kernel(name, device), 32 * LINEAR_WARPS, 0, device)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           residual: torch.Tensor | None = None, swiglu: bool = False,
           norm: RmsNorm | None = None, ahead: torch.Tensor | None = None,
           ahead_bytes: int = 0, kv_ahead: PagedAhead | None = None) -> torch.Tensor:
    """y = F.linear(x, weight, bias) for x [rows, k], 1 <= rows <= LINEAR_ROWS, with
    contiguous, 16-byte aligned rows, k a multiple of 8; weight [n, k] contiguous; bias [n] or
    None. Returns y [rows, n]; with `residual` [rows, n], residual + y; with `swiglu`,
    silu(gate) * up [rows, n / 2] of y's halves (weight stacks W_gate over W_up). Sums in fp32
    and rounds once, as cuBLAS does (only the order of the sums differs), and rounds what
    follows as the torch ops it replaces. With `norm` (an RmsNorm, not with a residual), y of
    norm.weight * RMSNorm(x) instead of x: within the dtype's precision of `rms_norm` before
    the linear (the normed x is not rounded), one launch fewer.

    ahead, ahead_bytes: the cross-kernel L2 prefetch. The grid's last wave (the CTAs that start
    last) brings `ahead_span` bytes at the start of `ahead` (the next kernel's operand, a
    contiguous tensor on x's device) into L2 as it drains, so that the next kernel's first
    loads hit L2. kv_ahead: the same wave, a warp of each CTA, brings the K and V blocks of a
    paged cache that the attention after this kernel reads (`PagedAhead`). Hints: y is the same
    with or without them."""
    problem = (linear_problem(x, weight, bias, residual, swiglu, norm)
               or ahead_problem(ahead, ahead_bytes, x.device)
               or paged_ahead_problem(kv_ahead, x.device))
    _check(problem is None, problem)
    (rows, k), n = x.shape, weight.shape[0]
    epilogue = "swiglu" if swiglu else "plain" if residual is None else "residual"
    width = n // 2 if swiglu else n
    out = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    if n:
        cols = LINEAR_COLS // 2 if swiglu else LINEAR_COLS  # output columns a CTA writes
        name = linear_name(CUDA_TYPES[x.dtype], rows, epilogue, norm is not None)
        grid = ceil_div(width, cols)
        launch(_kernel(name, x.device), (grid,), (32 * LINEAR_WARPS,),
               (ptr(out), ptr(x), ptr(weight), ptr(bias), ptr(residual), np.int32(n),
                np.int32(k), np.int64(x.stride(0)), *_norm_args(norm),
                *_linear_ahead_args(name, grid, x.device, ahead, ahead_bytes, kv_ahead)),
               x.device)
    return out


def linear_rope_write(x: torch.Tensor, norm: RmsNorm, weight: torch.Tensor,
                      bias: torch.Tensor | None, num_qo_heads: int, cos: torch.Tensor,
                      sin: torch.Tensor, positions: torch.Tensor, cache, slots: torch.Tensor, *,
                      ahead: torch.Tensor | None = None, ahead_bytes: int = 0,
                      kv_ahead: PagedAhead | None = None) -> torch.Tensor:
    """A RoPE layer's decode step from its input to attention in one kernel: the attention norm,
    the fused QKV linear, RoPE and the cache write, neither the normed x nor the QKV output
    written. x: the layer's input [n, k] (`linear`'s x, n <= LINEAR_ROWS), normed by `norm`
    (`linear`'s); weight: the stacked W_Q, W_K, W_V [(num_qo_heads + 2 num_kv_heads) * head_dim,
    k]; bias of it or None. Returns Q rotated at `positions` [n, num_qo_heads, head_dim] and
    writes K rotated and V into the paged `cache` (fp16 or bf16, either layout) at `slots`, each
    element as `linear(x, weight, bias, norm=norm)` then `rope_write` would. ahead, ahead_bytes,
    kv_ahead: `linear`'s cross-kernel prefetch. ValueError for what the kernel does not take,
    before anything is allocated."""
    problem = (linear_problem(x, weight, bias, norm=norm)
               or ahead_problem(ahead, ahead_bytes, x.device)
               or paged_ahead_problem(kv_ahead, x.device))
    _check(norm is not None, "norm: must be a layer_ops.RmsNorm (the attention norm)")
    _check(problem is None, problem)
    n = x.shape[0]
    width = _check_rope_write(num_qo_heads, cos, sin, positions, cache, slots, n, x.device)
    _check(weight.shape[0] == width,
           f"weight: shape {tuple(weight.shape)}, must have {width} rows ((num_qo_heads="
           f"{num_qo_heads} + 2 x {cache.num_kv_heads}) x {cache.head_dim})")
    _check(same_kind(x, cos, sin, cache.k_cache),
           f"x, cos, sin: {x.dtype}, {cos.dtype}, {sin.dtype}: must be the cache's dtype "
           f"({cache.dtype}), fp16 or bf16, on its CUDA device")
    q = torch.empty(n, num_qo_heads, cache.head_dim, dtype=x.dtype, device=x.device)
    name = linear_rope_write_name(CUDA_TYPES[x.dtype], n, cache.layout)
    grid = ceil_div(width // 2, LINEAR_COLS // 2)  # pairs of rows RoPE rotates together
    launch(_kernel(name, x.device), (grid,), (32 * LINEAR_WARPS,),
           (ptr(x), ptr(weight), ptr(bias), np.int32(x.shape[1]), np.int64(x.stride(0)),
            *_norm_args(norm), *_rope_write_args(q, num_qo_heads, cos, sin, positions, cache,
                                                 slots),
            *_linear_ahead_args(name, grid, x.device, ahead, ahead_bytes, kv_ahead)), x.device)
    return q
