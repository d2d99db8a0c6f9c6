"""Fitting the closed form's constants (kvlab.predict.closed_form) to recorded launch times:
least squares on log time (Levenberg-Marquardt from fixed starting values, so that a fit is
deterministic), per kernel family on the launches without prefetch, then per prefetch setting
its lift and tax with the family's constants held. Two inputs are measured, not fitted: kappa,
the share of a group's K+V re-reads that reach L2 (vllm_v1: ncu's L2 read bytes, counters
recorded on the H200), and the copy roofline on each SM count timed (attention_sms.json).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from kvlab.config import MODELS
from kvlab.gpus import GPUS, REFERENCE
from kvlab.gpus import copy_roofline_gbps as spec_roofline_gbps
from kvlab.kernels import FAMILIES
from kvlab.kernels.geometry import use_partitions
from kvlab.predict.closed_form import FamilyFit, Launch, launch, stack, time_s
from kvlab.predict.recorded import Recorded
from kvlab.results import load_recorded

# the fitted constants (FamilyFit's), their starting values; l2_tbps for vllm_v1 only
START = {"launch_us": 6.0, "merge_us": 4.0, "efficiency": 1.0, "lone_gelems": 20.0,
         "sm_gelems": 60.0, "cta_tokens": 128.0, "p": 3.0, "l2_tbps": 6.0}
COUNTERS = ("counters_sms", "counters_prefetch", "counters_block32", "counters")
MAX_ITERATIONS = 200


@dataclass(frozen=True, eq=False)
class Sample:
    """A recorded launch and its closed-form Launch."""

    recorded: Recorded
    launch: Launch

    @property
    def family(self) -> str:
        return self.recorded.point.family

    @property
    def prefetch(self) -> str:
        return self.recorded.point.prefetch.label()


def samples(recorded: tuple[Recorded, ...], by_sms: dict[int, float]) -> list[Sample]:
    return [Sample(r, launch(r.point, by_sms)) for r in recorded]


def rooflines_by_sms() -> dict[int, float]:
    """The H200's copy roofline (GB/s) on each SM count measured: the whole GPU's (kvlab.gpus),
    and those of attention_sms.json's green contexts."""
    by_sms = {GPUS[REFERENCE].num_sms: spec_roofline_gbps(REFERENCE)[0]}
    sms = load_recorded(REFERENCE, ["attention_sms"], {"roofline_copy_gbps_by_sms": dict})
    if sms is not None:
        by_sms |= {int(k): float(v) for k, v in sms["roofline_copy_gbps_by_sms"].items()}
    return dict(sorted(by_sms.items()))


def kappa_from_counters() -> dict[str, dict[str, float]]:
    """{"v1"|"v2": {"none"|"prefetch": kappa}}: the median over vllm_v1's GQA launches profiled
    on the H200 of (L2 read bytes / K+V - 1) / (group - 1), by vLLM's variant and whether it
    prefetched."""
    shares: dict[tuple[str, str], list[float]] = {}
    for name in COUNTERS:
        result = load_recorded(REFERENCE, [name], {"rows": ("model", "kernel", "batch",
                                                            "context", "prefetch")})
        for r in result["rows"] if result else ():
            m = MODELS[r["model"]]
            group = m.num_qo_heads // m.num_kv_heads
            if r["kernel"] != "vllm_v1" or group == 1 or "l2_read_bytes" not in r:
                continue
            kv = r["batch"] * r["context"] * m.num_kv_heads * m.head_dim * 4
            variant = "v2" if use_partitions(r["batch"], m.num_qo_heads, r["context"]) else "v1"
            which = "none" if r["prefetch"] == "none" else "prefetch"
            shares.setdefault((variant, which), []).append((r["l2_read_bytes"] / kv - 1)
                                                           / (group - 1))
    return {v: {w: round(statistics.median(shares[(v, w)]), 3) for w in ("none", "prefetch")}
            for v in ("v1", "v2")}


def least_squares(residual, theta: np.ndarray) -> np.ndarray:
    """Levenberg-Marquardt: the theta near `theta` that minimises sum(residual(theta)^2), with a
    forward-difference Jacobian."""
    theta = np.asarray(theta, dtype=float)
    r = residual(theta)
    cost, damping = r @ r, 1e-2
    for _ in range(MAX_ITERATIONS):
        jacobian = np.empty((r.size, theta.size))
        for j in range(theta.size):
            step = np.zeros_like(theta)
            step[j] = 1e-6
            jacobian[:, j] = (residual(theta + step) - r) / 1e-6
        normal, gradient = jacobian.T @ jacobian, jacobian.T @ r
        while True:
            move = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            trial = residual(theta + move)
            if trial @ trial < cost:
                gain = cost - trial @ trial
                theta, r, cost, damping = theta + move, trial, trial @ trial, damping / 3
                break
            damping *= 4
            if damping > 1e10:
                return theta
        if gain < 1e-10 * cost:
            break
    return theta


def _fitted_names(family: str) -> list[str]:
    """The constants fitted for `family`: all of START; gqa re-reads nothing through L2."""
    return [n for n in START if family == "vllm_v1" or n != "l2_tbps"]


def _family_fit(theta: np.ndarray, family: str, kappa: dict) -> FamilyFit:
    """The FamilyFit of theta: the logs of _fitted_names' constants (of p - 1 for p)."""
    values = {"l2_tbps": 0.0, **dict(zip(_fitted_names(family), np.exp(theta), strict=True))}
    values["p"] += 1.0
    return FamilyFit(**{k: float(v) for k, v in values.items()},
                     kappa=kappa if family == "vllm_v1" else {}, prefetch={})


def fit_family(family: str, mine: list[Sample], kappa: dict) -> FamilyFit:
    """The family's constants fitted to `mine` (its launches without prefetch)."""
    x, ms = stack([s.launch for s in mine]), np.array([s.recorded.ms for s in mine])
    start = np.log([START[n] - (1.0 if n == "p" else 0.0) for n in _fitted_names(family)])
    theta = least_squares(lambda t: np.log(1e3 * time_s(x, _family_fit(t, family, kappa)) / ms),
                          start)
    return _family_fit(theta, family, kappa)


def fit_prefetch(base: FamilyFit, label: str, mine: list[Sample]) -> tuple[float, float]:
    """(lift, tax) of the prefetch setting `label` fitted to `mine` (its launches), the
    family's other constants held."""
    x, ms = stack([s.launch for s in mine]), np.array([s.recorded.ms for s in mine])

    def residual(theta):
        fit = replace(base, prefetch={label: tuple(np.exp(theta))})
        return np.log(1e3 * time_s(x, fit, label) / ms)

    return tuple(float(v) for v in np.exp(least_squares(residual, np.zeros(2))))


def fit(train: list[Sample], kappa: dict) -> dict[str, FamilyFit]:
    """Every family's FamilyFit, its prefetch settings included, fitted to `train`; a family
    with no launch without prefetch in `train` is left out."""
    fits = {}
    for family in FAMILIES:
        mine = [s for s in train if s.family == family]
        base = [s for s in mine if s.prefetch == "none"]
        if not base:
            continue
        fits[family] = fit_family(family, base, kappa)
        labels = sorted({s.prefetch for s in mine} - {"none"})
        fits[family] = replace(fits[family], prefetch={
            label: fit_prefetch(fits[family], label, [s for s in mine if s.prefetch == label])
            for label in labels})
    return fits


def predict_ms(fits: dict[str, FamilyFit], test: list[Sample]) -> np.ndarray:
    """The closed form's ms for each of `test` under `fits` (NaN where its family or prefetch
    setting was not fitted)."""
    out = np.full(len(test), np.nan)
    groups: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(test):
        groups.setdefault((s.family, s.prefetch), []).append(i)
    for (family, label), at in groups.items():
        fit_ = fits.get(family)
        if fit_ is not None and (label == "none" or label in fit_.prefetch):
            out[at] = 1e3 * time_s(stack([test[i].launch for i in at]), fit_, label)
    return out
