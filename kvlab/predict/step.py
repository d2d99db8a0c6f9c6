"""Where a decode step's time goes, kernel by kernel, modelled.

One step of `kvlab.LLM` on a Llama or Qwen2 model runs, per layer, the attention norm, the QKV
GEMM, RoPE with the cache write, the decode attention, W_O, the MLP norm (with the residual),
gate and up, and down; then the final norm and the LM head (`step_kernels`). Above
STREAMING_ROWS sequences the linears are cuBLAS GEMMs, and the norms, RoPE with the cache
write, SwiGLU's product and down's residual add are kernels of their own. Up to it layer_ops'
weight-streaming linears take them in: QKV the attention norm, RoPE and the write; W_O the
residual; gate and up the MLP norm and SwiGLU; down the residual; the LM head the final norm.
Recordings made before the norms and RoPE went into the linears lack FOLDED_KEY
(`recorded_folded`): their steps are modelled, and fitted, with those kernels apart.
The list is a model of the launches: the embedding, the sampling and gqa's merge (where it
splits the context) are not counted apart. Each kernel must move its own bytes (weights,
activations, the K/V it reads): `bytes / roofline` at the copy roofline, HBM busy. Three
constants explain the rest of a recorded step:

- an overhead a modelled kernel: the gap to the next kernel in the CUDA graph, its ramp and its
  tail, time in which HBM idles. It is fitted apart at most STREAMING_ROWS sequences
  (`streaming_overhead_us`) and above (`overhead_us`);
- `per_sequence_us`, paid per sequence and layer: the work a step does beyond moving bytes
  (the GEMMs' arithmetic, attention's per-sequence setup and merge).

`fit_step_model` fits them by least squares to the H200's end-to-end recordings (the steps of
the engine with `gqa`, kvlab.results.E2E) and checks them on each model left out of the fit.
The overheads of a step's kernels are its idle budget, an estimate of what prefetching the next
kernel's operands into L2 across kernel boundaries could win back.

That prefetch is `kvlab.LLM(ahead_bytes=...)` (kvlab.model.layer.Ahead): kvlab's kernels
before each GEMM bring its weight's first bytes into L2. `ahead_size` sizes it to one kernel's
overhead at the copy roofline: the bytes HBM could move while it idles. `ahead_hits` says what
each GEMM of a step finds in L2: min(ahead_bytes, its weight) where a kernel before it
prefetches for it (`AHEAD_COVERED`), and the lines survive what is read in between. Only W_O's
prefetch has much in between: at most STREAMING_ROWS sequences the QKV linear issues it, and
the attention then reads the layer's K/V; it counts only where those bytes and the prefetch's
fit in L2 together. `step_anatomy` with `ahead_bytes` gives the step it bounds: each GEMM's
overhead shrinks by the time HBM would take to move its prefetched bytes, at most the whole
overhead. A bound, not a measurement: it assumes the prefetch moves its bytes while HBM idles
and that the GEMM then reads them at no cost.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from kvlab.checks import check_int, check_real
from kvlab.config import MAX_AHEAD_BYTES, MODELS, ModelConfig
from kvlab.gpus import GPUS, REFERENCE
from kvlab.results import E2E, load_result

__all__ = ["FOLDED_KEY", "StepModel", "ahead_hits", "ahead_size", "fit_step_model",
           "recorded_folded", "step_anatomy", "step_kernels"]

VARIANT = "gqa"  # the decode kernel whose steps the model is fitted on
ITEM = 2  # bytes of an fp16 weight, activation or K/V element
# kvlab.kernels.layer_ops.LINEAR_ROWS (not imported here: it loads torch): up to this batch the
# engine's linears run on layer_ops' weight-streaming kernel
STREAMING_ROWS = 2
# a recording's key saying its steps ran the norms and RoPE inside the streaming linears
FOLDED_KEY = "norms_in_linears"
# the GEMMs whose weight kvlab's kernels before them prefetch with ahead_bytes (Ahead): at a
# streaming batch each linear the next one's (W_O's across the attention); above it the norms
# for QKV, gate and up and the LM head, SwiGLU's product for down, W_O's none
AHEAD_COVERED = {True: ("qkv", "w_o", "gate + up", "down", "lm head"),
                 False: ("qkv", "gate + up", "down", "lm head")}
GEMMS = ("qkv", "w_o", "gate + up", "down")  # a layer's GEMMs, in step order


@dataclass(frozen=True)
class StepModel:
    """The fitted constants (us) and their check: the points fitted, and the largest and the
    median |predicted / recorded - 1| of a step over the models left out of the fit in turn."""

    streaming_overhead_us: float
    overhead_us: float
    per_sequence_us: float
    points: int
    held_out_error: float
    median_error: float


def _check_number(name: str, value, minimum: float = 0.0, strict: bool = True) -> float:
    check_real(name, value, minimum, open_min=strict)
    return float(value)


def _model(model: str) -> ModelConfig:
    if not isinstance(model, str) or model not in MODELS or MODELS[model].family == "opt":
        raise ValueError(f"model={model!r}: must be a Llama or Qwen2 preset of kvlab.MODELS")
    return MODELS[model]


def recorded_folded(result: dict) -> bool:
    """Whether a recording's steps ran the norms and RoPE inside the streaming linears (the
    engine's since FOLDED_KEY; False for a recording made before)."""
    return bool(result.get(FOLDED_KEY, False))


def step_kernels(model: str, batch: int, context: float,
                 folded: bool = True) -> list[tuple[str, float]]:
    """(name, bytes) of each kernel of one decode step of `model` (a Llama or Qwen2 preset) at
    `batch` sequences of `context` tokens each (a mean may be fractional): the layers' kernels
    in order, then the final norm and the LM head (one kernel up to STREAMING_ROWS). `folded`
    False: the engine's step before the norms and RoPE went into the streaming linears. Raises
    ValueError for another model, a batch that is not an integer >= 1 or a context that is not
    a number > 0."""
    m = _model(model)
    check_int("batch", batch, 1)
    batch, context = int(batch), _check_number("context", context)
    h, inter, qkv = m.hidden_size, m.intermediate_size, m.q_size + 2 * m.kv_size
    act = batch * ITEM  # an activation row's bytes per element
    attention = ("attention", 2 * ITEM * batch * context * m.kv_size + act * 2 * m.q_size)
    if batch <= STREAMING_ROWS and folded:  # the norms, RoPE, SwiGLU, residuals in the linears
        layer = [("qkv", ITEM * (qkv + 1) * h + act * (h + qkv)), attention,
                 ("w_o", ITEM * h * m.q_size + act * (m.q_size + 2 * h)),
                 ("gate + up", ITEM * (2 * inter + 1) * h + act * (h + inter)),
                 ("down", ITEM * h * inter + act * (inter + 2 * h))]
        return layer * m.num_layers + [
            ("lm head", ITEM * (m.vocab_size + 1) * h + act * (h + m.vocab_size))]
    layer = [("attention norm", ITEM * h + act * 3 * h),
             ("qkv", ITEM * qkv * h + act * (h + qkv)),
             ("rope + cache write", act * 2 * qkv), attention,
             ("w_o", ITEM * h * m.q_size + act * (m.q_size + h)),
             ("mlp norm", ITEM * h + act * 4 * h)]
    if batch <= STREAMING_ROWS:  # SwiGLU and the residual folded into the linears
        layer += [("gate + up", ITEM * 2 * inter * h + act * (h + inter)),
                  ("down", ITEM * h * inter + act * (inter + 2 * h))]
    else:
        layer += [("gate + up", ITEM * 2 * inter * h + act * (h + 2 * inter)),
                  ("swiglu", act * 3 * inter),
                  ("down", ITEM * h * inter + act * (inter + h)),
                  ("residual add", act * 3 * h)]
    return layer * m.num_layers + [
        ("final norm", ITEM * h + act * 2 * h),
        ("lm head", ITEM * m.vocab_size * h + act * (h + m.vocab_size))]


def _check_fit(fit) -> StepModel:
    if not isinstance(fit, StepModel):
        raise ValueError(f"fit={fit!r}: must be a StepModel (fit_step_model)")
    return fit


def ahead_size(fit: StepModel, roofline_gbps: float, batch: int = 1) -> int:
    """The cross-kernel prefetch's size (kvlab.LLM's ahead_bytes) for steps of `batch`
    sequences: what HBM moves at `roofline_gbps` (GB/s) in one kernel's fitted overhead (none
    where a fit's overhead is not positive), rounded down to 16-byte granules, at most
    MAX_AHEAD_BYTES (what kvlab.LLM takes). Raises ValueError as `step_anatomy`."""
    roofline_gbps = _check_number("roofline_gbps", roofline_gbps)
    check_int("batch", batch, 1)
    fit = _check_fit(fit)
    overhead = fit.streaming_overhead_us if batch <= STREAMING_ROWS else fit.overhead_us
    return int(min(MAX_AHEAD_BYTES, max(0.0, overhead * roofline_gbps * 1e3))) // 16 * 16


def step_anatomy(model: str, batch: int, context: float, roofline_gbps: float,
                 fit: StepModel, ahead_bytes: int = 0, l2_bytes: int | None = None,
                 folded: bool = True) -> dict:
    """One step modelled: {"kernels": per kernel name, in step order, {"name", "count" (a
    step's launches of it), "roofline_us" (its bytes at the copy roofline), "idle_us" (count x
    the overhead at this batch, less what ahead_bytes hides), "hidden_us" (what it hides)},
    "per_sequence_us", "roofline_us", "idle_us", "hidden_us", "step_us"} (all over the whole
    step; the step without hidden_us). ahead_bytes: the cross-kernel prefetch's bound (the
    module's docstring; `ahead_hits`, on an L2 of l2_bytes), 0 without. folded: the kernels of
    `step_kernels`. Raises ValueError as `step_kernels` and `ahead_hits`, for a roofline that
    is not a number > 0 and a fit that is not a StepModel."""
    kernels_of_step = step_kernels(model, batch, context, folded)
    roofline_gbps = _check_number("roofline_gbps", roofline_gbps)
    fit = _check_fit(fit)
    overhead = fit.streaming_overhead_us if batch <= STREAMING_ROWS else fit.overhead_us
    prefetched = iter(p for _, _, p in ahead_hits(model, batch, context, ahead_bytes, l2_bytes))
    kernels: dict[str, dict] = {}
    for name, nbytes in kernels_of_step:
        k = kernels.setdefault(name, {"name": name, "count": 0, "roofline_us": 0.0,
                                      "idle_us": 0.0, "hidden_us": 0.0})
        k["count"] += 1
        k["roofline_us"] += nbytes / roofline_gbps / 1e3
        hidden = (min(overhead, next(prefetched) / roofline_gbps / 1e3)
                  if name in GEMMS or name == "lm head" else 0.0)
        k["idle_us"] += overhead - hidden
        k["hidden_us"] += hidden
    per_sequence = fit.per_sequence_us * batch * MODELS[model].num_layers
    roofline, idle, hidden = (sum(k[key] for k in kernels.values())
                              for key in ("roofline_us", "idle_us", "hidden_us"))
    return {"kernels": list(kernels.values()), "per_sequence_us": per_sequence,
            "roofline_us": roofline, "idle_us": idle, "hidden_us": hidden,
            "step_us": roofline + idle + per_sequence}


def ahead_hits(model: str, batch: int, context: float, ahead_bytes: int,
               l2_bytes: int | None = None) -> list[tuple[str, int, int]]:
    """(name, weight bytes, bytes of it the cross-kernel prefetch has in L2 when it starts) of
    each GEMM of one decode step of `model` at `batch` sequences of `context` tokens, in step
    order (GEMMS a layer, then the LM head): min(ahead_bytes, the weight) where a kernel before
    it prefetches for it at this batch (AHEAD_COVERED) and, for W_O, where the layer's K/V that
    the attention reads in between fit in L2 (l2_bytes, default the H200's) beside them; else
    0. Raises ValueError as `step_kernels`, and for ahead_bytes that is not an integer >= 0 or
    an l2_bytes that is not one > 0."""
    step_kernels(model, batch, context)  # (its checks)
    check_int("ahead_bytes", ahead_bytes, 0)
    if l2_bytes is None:
        l2_bytes = GPUS[REFERENCE].l2_bytes
    check_int("l2_bytes", l2_bytes, 1)
    m, weights = MODELS[model], _weight_bytes(model)
    covered = set(AHEAD_COVERED[batch <= STREAMING_ROWS])
    kv_bytes = 2 * ITEM * batch * context * m.kv_size  # what the attention reads after QKV
    if "w_o" in covered and kv_bytes + min(ahead_bytes, weights["w_o"]) > l2_bytes:
        covered.discard("w_o")
    return [(n, weights[n], min(int(ahead_bytes), weights[n]) if n in covered else 0)
            for n in list(GEMMS) * m.num_layers + ["lm head"]]


def _weight_bytes(model: str) -> dict[str, int]:
    """The bytes of the weight each GEMM of a step of `model` streams, by kernel name."""
    m = MODELS[model]
    h = m.hidden_size
    return {"qkv": ITEM * (m.q_size + 2 * m.kv_size) * h, "w_o": ITEM * h * m.q_size,
            "gate + up": ITEM * 2 * m.intermediate_size * h,
            "down": ITEM * h * m.intermediate_size, "lm head": ITEM * m.vocab_size * h}


def _points(results) -> list[dict]:
    """Each recorded step of the engine with VARIANT on one GPU: model, batch, mean context
    (the prompt and half the new tokens), the step (us), its run's copy roofline and whether
    it ran the norms and RoPE in the linears."""
    return [{"model": r["model"], "batch": r["batch"],
             "context": r["prompt"] + r["new_tokens"] / 2, "step_us": 1e3 * r["step_ms"],
             "roofline_gbps": result["roofline_copy_gbps"], "folded": recorded_folded(result)}
            for result in results for r in result["rows"]
            if r["variant"] == VARIANT and r.get("tp", 1) == 1]


def _features(p: dict) -> tuple[list[float], float]:
    """A point's three features (kernels a step at a streaming batch, kernels a step at a
    larger one, sequences x layers) and its step past the roofline (us)."""
    kernels = step_kernels(p["model"], p["batch"], p["context"], p["folded"])
    roofline = sum(b for _, b in kernels) / p["roofline_gbps"] / 1e3
    streaming = p["batch"] <= STREAMING_ROWS
    return ([len(kernels) * streaming, len(kernels) * (not streaming),
             p["batch"] * MODELS[p["model"]].num_layers], p["step_us"] - roofline)


def _solve(points: list[dict]) -> np.ndarray:
    """(streaming_overhead_us, overhead_us, per_sequence_us) fitting the points by least
    squares (a constant no point exercises stays 0)."""
    rows = [_features(p) for p in points]
    coef, *_ = np.linalg.lstsq(np.array([f for f, _ in rows]), np.array([y for _, y in rows]),
                               rcond=None)
    return coef


def fit_step_model(results=None) -> StepModel:
    """`StepModel` fitted on the recorded steps (kvlab.results.E2E, or `results`: a list of
    `bench e2e` results), checked on each model left out. Raises ValueError for `results` that
    is not a list of such results, or holds fewer than two models' steps of VARIANT."""
    if results is None:
        results = [load_result(E2E[0], name) for name in E2E[1]]
    if not isinstance(results, list | tuple) or not all(
            isinstance(r, dict) and isinstance(r.get("rows"), list)
            and "roofline_copy_gbps" in r for r in results):
        raise ValueError(f"results={results!r:.80}: must be a list of bench e2e results (each "
                         "with rows and roofline_copy_gbps)")
    points = _points(results)
    models = sorted({p["model"] for p in points})
    if len(models) < 2:
        raise ValueError(f"the recordings hold {VARIANT}'s steps of {len(models)} model(s): the "
                         "fit needs two or more, one to leave out")
    errors = []
    for left_out in models:
        coef = _solve([p for p in points if p["model"] != left_out])
        for p in points:
            if p["model"] == left_out:
                features, excess = _features(p)
                predicted = p["step_us"] - excess + float(np.dot(coef, features))
                errors.append(abs(predicted / p["step_us"] - 1))
    streaming, overhead, per_sequence = (float(c) for c in _solve(points))
    return StepModel(streaming, overhead, per_sequence, len(points), max(errors),
                     statistics.median(errors))
