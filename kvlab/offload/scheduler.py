"""KVPR's split point (ACL 2025): recompute K, V of the first l cached tokens from their layer-input
activations on the GPU while the K, V of the other s' - l tokens cross PCIe.

Per layer and decode step, for b sequences of s' cached tokens, hidden size h, and p bytes per
element:
    bytes of activations X[0:l]  M_X(l)  = b l h p
    bytes of K, V[l:s']          M_KV(l) = 2 b (s' - l) kv p      kv = num_kv_heads x head_dim
    recompute FLOPs              N(l)    = 2 b l h (2 kv)         (X W_K and X W_V)
The paper writes kv = h (multi-head attention). With GQA, kv < h and, once kv <= h / 2, a
recomputed token costs as many PCIe bytes (h) as it saves (2 kv) or more: l = 0 must win.

Three models of one layer's time, t(l) for each integer l in [0, s']:
- "paper": t(l) = M_X(l) / v_com + max(N(l) / v_gpu, M_KV(l) / v_com). Recomputation waits for
  all of X, and the KV copy waits for X too (one PCIe link).
- "chunked": X streams in `num_chunks` chunks and chunk k is recomputed while chunk k + 1 and then
  the KV cross the link. With T_X, T_KV and T_R the three full durations, the link is busy
  T_X + T_KV and the recomputation ends at max(T_X / n + T_R, T_X + T_R / n) (the pipeline's
  first and last chunk bound it), so t(l) = max(T_X + T_KV, T_X / n + T_R, T_X + T_R / n).
  With n = 1 it is the paper's model; more chunks never make it slower.
- "pipelined": t(l) = max(T_X + T_KV, T_R). The runtime loads layer i + 1 while layer i
  computes, so in steady state a layer costs whichever of the link and the GPU is busier: the
  chunked model's pipeline fill and drain overlap the neighbouring layers (on the H200 the
  chunked model's split ran slower than this model's full recomputation at OPT-6.7B, 16 x 1k:
  benchmarks/README.md). With T_L = 0 it is also the lower bound of any schedule of split l.
All leave out the write-back of the new token. The layer's own work (attention over every K, V,
the projections, the MLP), T_L = `LinkAndCompute.layer_seconds`, is left out too when it is 0 (the
paper's models). Otherwise the paper's and the chunked model add it after the rest (a constant: it
moves no optimum), and the pipelined model puts it beside the recomputation on the GPU:
t(l) = max(T_X + T_KV, T_R + T_L). Where T_L is a sizeable part of a layer (OPT-30B at small
batches), that optimum recomputes fewer tokens than the bound below would.
The pipelined model also knows the host: a unit cannot run faster than the host enqueues it, H(l)
= H_0 + min(l, n) H_c (`unit_host_seconds`, `chunk_host_seconds`: every recompute chunk adds CUDA
calls), so t(l) = max(T_X + T_KV, T_R + T_L, H(l)). It binds where a unit moves little data (small
units, as in a column of several GPU batches). It is also the least certain input: measured as
the wall clock of a step at l = 0, it can count the host's waits on a busy GPU too
(benchmarks/README.md gives a host-bound point where settings at the same l = 0 took medians
of 38.9-51.4 ms).

With the weights offloaded too, a layer's weights cross the same link: W_K, W_V (and their
biases) first, so that recomputation can start, then the rest. `LayerShape.weight_bytes` holds the
two parts per GPU batch (a column-by-column schedule shares one load among its GPU batches;
`unit_shape` counts them from the model's shapes). With T_WK and T_WR their copy times: paper
t(l) = T_WK + T_X + max(T_R, T_KV + T_WR); chunked adds T_WK to the recomputation's start and
T_WK + T_WR to the link's busy time; pipelined t(l) = max(T_WK + T_X + T_KV + T_WR, T_R). With no
weight bytes these are the models above.

`best_split` minimises t(l) exactly over the integers without drawing the curve, so any context
costs it the same few evaluations: each model's t(l) is the largest of a few terms linear in l,
but for the host's H(l), which bends once, at l = n. On [0, n] and on [n, s'] it is then convex
and piecewise linear, and its integer minimum lies at an end or next to where two terms cross.
Ties go to the smallest l: every l whose time is within a relative 1e-9 (float noise) of the
minimum counts as the minimum, and the first such l lies at an end or next to where a term
crosses that level. So l = 0 wins wherever K, V per token are no larger than X: at kv = h / 2
(tiny-llama) the link's time is the same at every l but for rounding. `layer_times` draws the
curve, for plots, up to MAX_CURVE_CONTEXT.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from kvlab.arith import ceil_div
from kvlab.checks import check_int, check_positive_int, is_int, is_real
from kvlab.config import ModelConfig

MODELS_OF_TIME = ("paper", "chunked", "pipelined")
SCHEDULES = ("row", "column")  # the runtime's orders of units (kvlab.offload.runtime)
WEIGHTS = ("resident", "offloaded")  # where the runtime's weights live
ALIGN = 256  # bytes: each tensor of an offloaded layer starts on this boundary
MAX_CURVE_CONTEXT = 2**22  # the longest context whose t(l) curve `layer_times` draws
TIE_TOLERANCE = 1e-9  # relative: times this close to the minimum tie with it (float noise)


@dataclass(frozen=True)
class LinkAndCompute:
    """What the scheduler needs to know about the machine: `v_com` and `v_gpu`.

    h2d_bytes_per_s: pinned host-to-device copy rate. recompute_flops_per_s: the rate of the K, V
    recomputation (GEMM, bias, RoPE) for the shapes at hand. `source` says where they come from
    ("measured on ...", "recorded on ...", "what-if"). d2h_bytes_per_s: the write-back rate, when
    known (the models leave the write-back of the new token out). layer_seconds: the time of
    one layer's own decode work for the shapes at hand, the slower of the GPU and the host's
    enqueueing (0: left out, as the paper does). unit_host_seconds, chunk_host_seconds: the
    host's time to enqueue one unit (layer, GPU batch) of the runtime at l = 0, and what each
    recompute chunk adds to it (0: left out). A step cannot run faster than the host enqueues
    it (`kvlab.offload.graphs` states what the host cost on the H200).
    """

    h2d_bytes_per_s: float
    recompute_flops_per_s: float
    source: str
    d2h_bytes_per_s: float | None = None
    layer_seconds: float = 0.0
    unit_host_seconds: float = 0.0
    chunk_host_seconds: float = 0.0

    def __post_init__(self):
        for name in ("h2d_bytes_per_s", "recompute_flops_per_s", "d2h_bytes_per_s"):
            value = getattr(self, name)
            if name == "d2h_bytes_per_s" and value is None:
                continue
            if not (is_real(value) and value > 0):
                raise ValueError(f"{name}={value!r}: must be a positive finite number")
            object.__setattr__(self, name, float(value))
        for name in ("layer_seconds", "unit_host_seconds", "chunk_host_seconds"):
            t = getattr(self, name)
            if not (is_real(t) and t >= 0):
                raise ValueError(f"{name}={t!r}: must be a finite number >= 0")
            object.__setattr__(self, name, float(t))
        if not isinstance(self.source, str):
            raise ValueError(f"source={self.source!r}: must be a string (where the rates "
                             "come from)")


@dataclass(frozen=True)
class LayerShape:
    """One layer's offloaded work in one decode step: `batch` sequences of `context` cached tokens
    (s'), elements of `dtype_bytes` bytes. `weight_bytes`: (W_K and W_V, the rest) of the layer's
    weights that cross the link for this batch; (0, 0) with the weights resident."""

    model: ModelConfig
    batch: int
    context: int
    dtype_bytes: int = 2
    weight_bytes: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self):
        check_positive_int("batch", self.batch)
        check_positive_int("context", self.context)
        check_dtype_bytes(self.dtype_bytes)
        weight_bytes = self.weight_bytes
        if not (isinstance(weight_bytes, tuple) and len(weight_bytes) == 2
                and all(is_real(b) and b >= 0 for b in weight_bytes)):
            raise ValueError(f"weight_bytes={weight_bytes!r}: must be two finite byte counts "
                             f">= 0")

    def activation_bytes(self, l) -> np.ndarray:
        tokens = np.asarray(l, dtype=np.float64)
        return self.batch * tokens * self.model.hidden_size * self.dtype_bytes

    def kv_bytes(self, l) -> np.ndarray:
        tokens = self.context - np.asarray(l, dtype=np.float64)
        return 2 * self.batch * tokens * self.model.kv_size * self.dtype_bytes

    def recompute_flops(self, l) -> np.ndarray:
        return 4.0 * self.batch * np.asarray(l, dtype=np.float64) * self.model.hidden_size * (
            self.model.kv_size
        )


def check_dtype_bytes(dtype_bytes) -> None:
    """ValueError unless `dtype_bytes` (bytes of an element) is 1, 2 or 4."""
    if not is_int(dtype_bytes) or dtype_bytes not in (1, 2, 4):
        raise ValueError(f"dtype_bytes={dtype_bytes!r}: must be 1, 2 or 4")


def layer_weight_bytes(model: ModelConfig, dtype_bytes: int = 2) -> tuple[int, int]:
    """(W_K and W_V with their biases, the whole layer): the bytes of one of `model`'s layers as
    `kvlab.offload.weights.Packing` lays it out for offloading, every tensor padded to ALIGN.
    ValueError unless dtype_bytes is 1, 2 or 4."""
    check_dtype_bytes(dtype_bytes)
    h, q, kv, ffn = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    opt, layernorm, bias = model.family == "opt", model.norm == "layernorm", model.qkv_bias

    def packed(*numels):
        return sum(ceil_div(n * dtype_bytes, ALIGN) * ALIGN for n in numels)

    kv_part = packed(kv * h, kv * h, *(2 * [kv] if bias else []))
    rest = packed(q * h, h * q, h, h, ffn * h, h * ffn,  # W_Q, W_O, the norms, the MLP
                  *([q] if bias else []), *(2 * [h] if layernorm else []),
                  *([h, ffn, h] if opt else [ffn * h]))  # OPT's b_O and MLP biases; W_gate
    return kv_part, kv_part + rest


def unit_shape(model: ModelConfig, batch: int, context: int, schedule: str = "row",
               gpu_batches: int = 1, weights: str = "resident", dtype_bytes: int = 2
               ) -> LayerShape:
    """One unit's (layer, GPU batch) work when the runtime runs `batch` sequences of `context`
    cached tokens as `gpu_batches` GPU batches in `schedule` order, with the weights resident or
    offloaded: a column shares one load of a layer's weights among its GPU batches, a row loads
    them once per GPU batch. A step is num_layers x gpu_batches such units."""
    check_positive_int("batch", batch)
    check_positive_int("gpu_batches", gpu_batches)
    if batch % gpu_batches:
        raise ValueError(f"gpu_batches={gpu_batches}: must divide batch={batch}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: must be one of {SCHEDULES}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}: must be one of {WEIGHTS}")
    weight_bytes = (0.0, 0.0)
    if weights == "offloaded":
        kv, total = layer_weight_bytes(model, dtype_bytes)
        share = gpu_batches if schedule == "column" else 1
        weight_bytes = (kv / share, (total - kv) / share)
    return LayerShape(model, batch // gpu_batches, context, dtype_bytes, weight_bytes)


def check_split(l: int, context: int) -> None:
    """Raise ValueError unless `l` is an integer in [0, context]."""
    if isinstance(l, bool) or not isinstance(l, (int, np.integer)) or not 0 <= l <= context:
        raise ValueError(f"l={l!r}: must be an integer in [0, s'={context}]")


def token_chunks(l: int, num_chunks: int) -> list[tuple[int, int]]:
    """[0:l] as up to `num_chunks` non-empty token ranges of near-equal size (chunk c ends at
    l c / num_chunks rounded half to even): the chunks in which X streams in and is recomputed.
    With num_chunks >= l, every token is a chunk."""
    check_int("l", l, 0)
    check_positive_int("num_chunks", num_chunks)
    l = int(l)
    n = min(int(num_chunks), max(l, 1))  # NOTE: chunks past the l-th would all be empty
    bounds = [round(Fraction(l * c, n)) for c in range(n + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _check_model_of_time(model_of_time: str, num_chunks: int) -> None:
    if model_of_time not in MODELS_OF_TIME:
        raise ValueError(f"model_of_time={model_of_time!r}: must be one of {MODELS_OF_TIME}")
    check_positive_int("num_chunks", num_chunks)


def _terms(shape: LayerShape, rates: LinkAndCompute, model_of_time: str, num_chunks: int,
           ls: np.ndarray) -> list[np.ndarray]:
    """The terms whose largest is t(l), each at every split of `ls` (ValueError where one
    overflows float64)."""
    with np.errstate(over="ignore", invalid="ignore"):
        terms = _raw_terms(shape, rates, model_of_time, num_chunks, ls)
    if not all(np.isfinite(term).all() for term in terms):
        raise ValueError(f"rates={rates!r}: the predicted times of {shape.batch} x "
                         f"{shape.context} tokens (weight_bytes={shape.weight_bytes}) overflow "
                         f"float64; the rates are too small for the shape")
    return terms


def _raw_terms(shape: LayerShape, rates: LinkAndCompute, model_of_time: str, num_chunks: int,
               ls: np.ndarray) -> list[np.ndarray]:
    """The terms whose largest is t(l), each at every split of `ls`: all linear in l, but the
    pipelined model's host term, which bends at l = num_chunks (see the module doc)."""
    t_x = shape.activation_bytes(ls) / rates.h2d_bytes_per_s
    t_kv = shape.kv_bytes(ls) / rates.h2d_bytes_per_s
    t_r = shape.recompute_flops(ls) / rates.recompute_flops_per_s
    t_wk, t_wr = (b / rates.h2d_bytes_per_s for b in shape.weight_bytes)
    t_l, n = rates.layer_seconds, num_chunks
    if model_of_time == "paper":  # T_WK + T_X + max(T_R, T_KV + T_WR) + T_L
        return [t_wk + t_x + t_r + t_l, t_wk + t_x + t_kv + t_wr + t_l]
    link = t_wk + t_x + t_kv + t_wr
    if model_of_time == "pipelined":
        host = rates.unit_host_seconds + np.minimum(ls, n) * rates.chunk_host_seconds
        return [link, t_r + t_l, host]
    return [link + t_l, t_wk + t_x / n + t_r + t_l, t_wk + t_x + t_r / n + t_l]


def _times(shape: LayerShape, rates: LinkAndCompute, model_of_time: str, num_chunks: int,
           ls: np.ndarray) -> np.ndarray:
    """t(l) at every split of `ls` (float64 token counts in [0, s'])."""
    return np.maximum.reduce(_terms(shape, rates, model_of_time, num_chunks, ls))


def layer_times(shape: LayerShape, rates: LinkAndCompute, model_of_time: str = "paper",
                num_chunks: int = 8) -> np.ndarray:
    """Predicted seconds per layer at every split l = 0, 1, ..., s' (the t(l) curve, for plots:
    s' = `shape.context` up to MAX_CURVE_CONTEXT; `best_split` needs no curve)."""
    _check_model_of_time(model_of_time, num_chunks)
    if shape.context > MAX_CURVE_CONTEXT:
        raise ValueError(f"shape.context={shape.context}: layer_times draws at most "
                         f"{MAX_CURVE_CONTEXT:,} tokens (best_split and layer_time take any)")
    ls = np.arange(shape.context + 1, dtype=np.float64)
    return _times(shape, rates, model_of_time, num_chunks, ls)


def layer_time(shape: LayerShape, rates: LinkAndCompute, l: int, model_of_time: str = "paper",
               num_chunks: int = 8) -> float:
    """Predicted seconds per layer at split `l`."""
    _check_model_of_time(model_of_time, num_chunks)
    check_split(l, shape.context)
    return float(_times(shape, rates, model_of_time, num_chunks, np.array([l], np.float64))[0])


def _crossings(shape: LayerShape, rates: LinkAndCompute, model_of_time: str, num_chunks: int,
               level: float | None = None) -> np.ndarray:
    """Integer splits where t(l) can reach its minimum (`level` None) or first fall to `level`:
    0, num_chunks and s', and the integers next to where two of its terms (or a term and
    `level`) cross, on [0, num_chunks] and on [num_chunks, s'], where every term is linear."""
    s = shape.context
    bends = np.array(sorted({0, min(num_chunks, s), s}), dtype=np.float64)
    at_bends = np.array(_terms(shape, rates, model_of_time, num_chunks, bends))  # [terms, bends]
    if level is not None:
        at_bends = np.vstack([at_bends, np.full(len(bends), level)])
    found = [bends]
    for k, (a, b) in enumerate(zip(bends, bends[1:], strict=False)):
        start = at_bends[:, k]  # [terms]
        slope = (at_bends[:, k + 1] - start) / (b - a)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = a + (start[:, None] - start[None, :]) / (slope[None, :] - slope[:, None])
        x = x[np.isfinite(x) & (x >= a) & (x <= b)]
        # floor and ceil, and one further each way for the rounding of x
        found.append(np.clip(np.floor(x)[:, None] + np.arange(-1, 3), a, b).ravel())
    return np.unique(np.concatenate(found))


@dataclass(frozen=True)
class Split:
    """The best split under one model of time: `l` tokens recomputed, `seconds` per layer."""

    l: int
    seconds: float
    model_of_time: str
    full_transfer_seconds: float  # l = 0: every K, V byte crosses the link

    @property
    def speedup(self) -> float:
        """Predicted gain over full transfer (1.0 when l = 0)."""
        return self.full_transfer_seconds / self.seconds


def best_split(shape: LayerShape, rates: LinkAndCompute, model_of_time: str = "paper",
               num_chunks: int = 8) -> Split:
    """The integer l in [0, s'] with the smallest predicted layer time, exactly, for any context
    (no t(l) curve: see the module doc). Ties go to the smaller l (less recomputation for the
    same time): the smallest l whose time is within a relative TIE_TOLERANCE of the minimum.
    ValueError, as from layer_time(s), where the times overflow float64 (rates too small for
    the shape's bytes and FLOPs)."""
    _check_model_of_time(model_of_time, num_chunks)
    args = (shape, rates, model_of_time, num_chunks)
    ls = _crossings(*args)
    level = _times(*args, ls).min() * (1 + TIE_TOLERANCE)
    ls = _crossings(*args, level)
    times = _times(*args, ls)
    best = int(np.flatnonzero(times <= level)[0])  # ls is sorted: the smallest l
    return Split(int(ls[best]), float(times[best]), model_of_time, float(times[0]))


def lower_bound_seconds(shape: LayerShape, rates: LinkAndCompute, l: int | None = None) -> float:
    """`max(PCIe bytes / v_com, recompute FLOPs / v_gpu)` at split `l`, or at the best split when
    `l` is None: no schedule of that split can beat it, however well it overlaps (the
    "pipelined" model without the layer's own work and the host's)."""
    bare = replace(rates, layer_seconds=0.0, unit_host_seconds=0.0, chunk_host_seconds=0.0)
    if l is None:
        return best_split(shape, bare, "pipelined").seconds
    return layer_time(shape, bare, l, "pipelined")
