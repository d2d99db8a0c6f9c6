"""KVPR's split point (ACL 2025): recompute K, V of the first l cached tokens from their layer-input
activations on the GPU while the K, V of the other s' - l tokens cross PCIe.

Per layer and decode step, for b sequences of s' cached tokens, hidden size h, and p bytes per
element:
    bytes of activations X[0:l]  M_X(l)  = b l h p
    bytes of K, V[l:s']          M_KV(l) = 2 b (s' - l) kv p      kv = num_kv_heads x head_dim
    recompute FLOPs              N(l)    = 2 b l h (2 kv)         (X W_K and X W_V)
The paper writes kv = h (multi-head attention). With GQA, kv < h and, once kv <= h / 2, a
recomputed token costs as many PCIe bytes (h) as it saves (2 kv) or more: l = 0 must win.

Two models of one layer's time, each minimised exactly over every integer l in [0, s']:
- "paper": t(l) = M_X(l) / v_com + max(N(l) / v_gpu, M_KV(l) / v_com). Recomputation waits for
  all of X, and the KV copy waits for X too (one PCIe link).
- "chunked": X streams in `num_chunks` chunks and chunk k is recomputed while chunk k + 1 and then
  the KV cross the link. With T_X, T_KV and T_R the three full durations, the link is busy
  T_X + T_KV and the recomputation ends at max(T_X / n + T_R, T_X + T_R / n) (the pipeline's
  first and last chunk bound it), so t(l) = max(T_X + T_KV, T_X / n + T_R, T_X + T_R / n).
  With n = 1 it is the paper's model; more chunks never make it slower.
- "pipelined": t(l) = max(T_X + T_KV, T_R). The runtime loads layer i + 1 while layer i
  computes, so in steady state a layer costs whichever of the link and the GPU is busier: the
  chunked model's pipeline fill and drain overlap the neighbouring layers. (On the H200,
  OPT-6.7B at 16 x 1k: chunked split 87.7 ms per step, full recomputation - this model's
  choice - 82.3 ms.) With T_L = 0 it is also the lower bound of any schedule of split l.
All leave out the write-back of the new token. The layer's own work (attention over every K, V,
the projections, the MLP), T_L = `LinkAndCompute.layer_seconds`, is left out too when it is 0 (the
paper's models). Otherwise the paper's and the chunked model add it after the rest (a constant: it
moves no optimum), and the pipelined model puts it beside the recomputation on the GPU:
t(l) = max(T_X + T_KV, T_R + T_L). Where T_L is a sizeable part of a layer (OPT-30B at small
batches), that optimum recomputes fewer tokens than the bound below would.
The pipelined model also knows the host: a unit cannot run faster than the host enqueues it, H(l)
= H_0 + min(l, n) H_c (`unit_host_seconds`, `chunk_host_seconds`: every recompute chunk adds CUDA
calls), so t(l) = max(T_X + T_KV, T_R + T_L, H(l)). It binds where a unit moves little data:
OPT-6.7B at 16 x 512 as a column of 4 GPU batches, on the H200, measured 0.47 ms of host per unit
(128 units, 60 ms a step; kvpr_schedules.json). It is also the least certain input: measured as
the wall clock of a step at l = 0, it can count the host's waits on a busy GPU too (at that point
l = 391 ran in 49.9 ms, under the host's estimate).

With the weights offloaded too, a layer's weights cross the same link: W_K, W_V (and their
biases) first, so that recomputation can start, then the rest. `LayerShape.weight_bytes` holds the
two parts per GPU batch (a column-by-column schedule shares one load among its GPU batches;
`unit_shape` counts them from the model's shapes). With T_WK and T_WR their copy times: paper
t(l) = T_WK + T_X + max(T_R, T_KV + T_WR); chunked adds T_WK to the recomputation's start and
T_WK + T_WR to the link's busy time; pipelined t(l) = max(T_WK + T_X + T_KV + T_WR, T_R). With no
weight bytes these are the models above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig

MODELS_OF_TIME = ("paper", "chunked", "pipelined")
SCHEDULES = ("row", "column")  # the runtime's orders of units (kvlab.offload.runtime)
WEIGHTS = ("resident", "offloaded")  # where the runtime's weights live
ALIGN = 256  # bytes: each tensor of an offloaded layer starts on this boundary


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
            if not (isinstance(value, (int, float)) and value > 0 and np.isfinite(value)):
                raise ValueError(f"{name}={value!r}: must be a positive finite number")
        for name in ("layer_seconds", "unit_host_seconds", "chunk_host_seconds"):
            t = getattr(self, name)
            if not (isinstance(t, (int, float)) and t >= 0 and np.isfinite(t)):
                raise ValueError(f"{name}={t!r}: must be a finite number >= 0")


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
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"dtype_bytes={self.dtype_bytes!r}: must be 1, 2 or 4")
        if len(self.weight_bytes) != 2 or not all(b >= 0 for b in self.weight_bytes):
            raise ValueError(f"weight_bytes={self.weight_bytes!r}: must be two byte counts >= 0")

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


def layer_weight_bytes(model: ModelConfig, dtype_bytes: int = 2) -> tuple[int, int]:
    """(W_K and W_V with their biases, the whole layer): the bytes of one of `model`'s layers as
    `kvlab.offload.weights.Packing` lays it out for offloading, every tensor padded to ALIGN."""
    h, q, kv, ffn = model.hidden_size, model.q_size, model.kv_size, model.intermediate_size
    opt, layernorm, bias = model.family == "opt", model.norm == "layernorm", model.qkv_bias

    def packed(*numels):
        return sum(-(-n * dtype_bytes // ALIGN) * ALIGN for n in numels)

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
    """[0:l] as up to `num_chunks` non-empty token ranges of near-equal size: the chunks in
    which X streams in and is recomputed."""
    bounds = [round(l * c / num_chunks) for c in range(num_chunks + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _check_model_of_time(model_of_time: str, num_chunks: int) -> None:
    if model_of_time not in MODELS_OF_TIME:
        raise ValueError(f"model_of_time={model_of_time!r}: must be one of {MODELS_OF_TIME}")
    check_positive_int("num_chunks", num_chunks)


def layer_times(shape: LayerShape, rates: LinkAndCompute, model_of_time: str = "paper",
                num_chunks: int = 8) -> np.ndarray:
    """Predicted seconds per layer at every split l = 0, 1, ..., s' (the t(l) curve)."""
    _check_model_of_time(model_of_time, num_chunks)
    ls = np.arange(shape.context + 1)
    t_x = shape.activation_bytes(ls) / rates.h2d_bytes_per_s
    t_kv = shape.kv_bytes(ls) / rates.h2d_bytes_per_s
    t_r = shape.recompute_flops(ls) / rates.recompute_flops_per_s
    t_wk, t_wr = (b / rates.h2d_bytes_per_s for b in shape.weight_bytes)
    t_l = rates.layer_seconds
    if model_of_time == "paper":
        return t_wk + t_x + np.maximum(t_r, t_kv + t_wr) + t_l
    link = t_wk + t_x + t_kv + t_wr
    if model_of_time == "pipelined":
        host = rates.unit_host_seconds + np.minimum(ls, num_chunks) * rates.chunk_host_seconds
        return np.maximum.reduce([link, t_r + t_l, host])
    n = num_chunks
    return np.maximum.reduce([link, t_wk + t_x / n + t_r, t_wk + t_x + t_r / n]) + t_l


def layer_time(shape: LayerShape, rates: LinkAndCompute, l: int, model_of_time: str = "paper",
               num_chunks: int = 8) -> float:
    """Predicted seconds per layer at split `l`."""
    check_split(l, shape.context)
    return float(layer_times(shape, rates, model_of_time, num_chunks)[l])


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
    """The integer l in [0, s'] with the smallest predicted layer time; ties go to the smaller l
    (less recomputation for the same time)."""
    times = layer_times(shape, rates, model_of_time, num_chunks)
    best = int(np.argmin(times))  # the first minimum: the smallest l
    return Split(best, float(times[best]), model_of_time, float(times[0]))


def lower_bound_seconds(shape: LayerShape, rates: LinkAndCompute, l: int | None = None) -> float:
    """`max(PCIe bytes / v_com, recompute FLOPs / v_gpu)` at split `l`, or at the best split when
    `l` is None: no schedule of that split can beat it, however well it overlaps (the
    "pipelined" model without the layer's own work and the host's)."""
    bare = replace(rates, layer_seconds=0.0, unit_host_seconds=0.0, chunk_host_seconds=0.0)
    if l is None:
        return best_split(shape, bare, "pipelined").seconds
    return layer_time(shape, bare, l, "pipelined")
