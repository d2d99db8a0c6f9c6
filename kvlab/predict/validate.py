"""The closed form's error, measured honestly: fitted on some recordings, tested on the others.

Leave one model out: fit on three of the four models' launches, predict the fourth's (a new
head layout at shapes and settings recorded for others). Leave one region out: fit on every
launch outside a region of shapes or settings (REGIONS), predict those inside it (an
extrapolation along that dimension). The error of a launch is |predicted / measured - 1|.
`errors` gives, per kernel family and prefetch setting, the median and 90th percentile of each;
`bands` the 90th percentiles an answer carries as its error band.
"""

from __future__ import annotations

import numpy as np

from kvlab.predict.fit import Sample, fit, predict_ms

# region -> whether a recorded LaunchPoint lies in it
REGIONS = {
    "context >= 16k": lambda p: p.seq_lens is None and p.context >= 16384,
    "batch >= 64": lambda p: p.batch >= 64,
    "fewer SMs": lambda p: p.num_sms < p.gpu.num_sms,
    "mixed lengths": lambda p: p.seq_lens is not None,
    "fp8 or bf16": lambda p: p.dtype != "float16",
}
ALL = "all settings"  # the row that pools a family's prefetch settings


def held_out(all_samples: list[Sample], kappa: dict, test) -> np.ndarray:
    """|predicted / measured - 1| of each sample for which `test(sample)` holds, predicted by
    a fit to the others (NaN elsewhere, and where the fit lacks its family or setting)."""
    inside = np.array([bool(test(s)) for s in all_samples])
    fits = fit([s for s, i in zip(all_samples, inside, strict=True) if not i], kappa)
    errors = np.full(len(all_samples), np.nan)
    chosen = [s for s, i in zip(all_samples, inside, strict=True) if i]
    measured = np.array([s.recorded.ms for s in chosen])
    errors[inside] = np.abs(predict_ms(fits, chosen) / measured - 1)
    return errors


def one_model_out(all_samples: list[Sample], kappa: dict) -> np.ndarray:
    """Each sample's error predicted by a fit to the other models' launches."""
    errors = np.full(len(all_samples), np.nan)
    for model in sorted({s.recorded.point.model for s in all_samples}):
        one = held_out(all_samples, kappa, lambda s, model=model: s.recorded.point.model == model)
        errors = np.where(np.isnan(one), errors, one)
    return errors


def all_errors(all_samples: list[Sample], kappa: dict) -> dict[str, np.ndarray]:
    """Each sample's error: "fitted" (in sample), "one model out" (each model held out in turn),
    and each region of REGIONS held out."""
    measured = np.array([s.recorded.ms for s in all_samples])
    found = {"fitted": np.abs(predict_ms(fit(all_samples, kappa), all_samples) / measured - 1),
             "one model out": one_model_out(all_samples, kappa)}
    for region, inside in REGIONS.items():
        found[region] = held_out(all_samples, kappa, lambda s, f=inside: f(s.recorded.point))
    return found


def _summary(errors: np.ndarray) -> dict | None:
    errors = errors[~np.isnan(errors)]
    if not errors.size:
        return None
    return {"n": int(errors.size), "median": round(float(np.median(errors)), 4),
            "p90": round(float(np.quantile(errors, 0.9)), 4)}


def errors(all_samples: list[Sample], kappa: dict) -> dict:
    """{family: {prefetch setting or ALL: {check: {"n", "median", "p90"} or None}}} over
    `all_errors`' checks."""
    found = all_errors(all_samples, kappa)
    table: dict = {}
    for family in sorted({s.family for s in all_samples}):
        mine = np.array([s.family == family for s in all_samples])
        labels = sorted({s.prefetch for s in all_samples if s.family == family},
                        key=lambda label: (label != "none", label))
        table[family] = {}
        for label in (*labels, ALL):
            chosen = mine & np.array([label in (ALL, s.prefetch) for s in all_samples])
            table[family][label] = {check: _summary(e[chosen]) for check, e in found.items()}
    return table


def by_model(all_samples: list[Sample], kappa: dict) -> dict:
    """{family: {model: {"n", "median", "p90"}}}: each model's launches, every prefetch setting,
    predicted by a fit to the other models'."""
    errors = one_model_out(all_samples, kappa)
    return {family: {model: _summary(errors[np.array([
        s.family == family and s.recorded.point.model == model for s in all_samples])])
        for model in sorted({s.recorded.point.model for s in all_samples})}
        for family in sorted({s.family for s in all_samples})}


def bands(table: dict) -> dict:
    """{family: {prefetch setting or ALL: {"interpolated": p90 of one model out,
    "extrapolated": the largest p90 of a region held out}}} from an `errors` table."""
    found = {}
    for family, rows in table.items():
        found[family] = {}
        for label, checks in rows.items():
            regions = [checks[r]["p90"] for r in REGIONS if checks.get(r)]
            lomo = (checks["one model out"] or checks["fitted"])["p90"]
            found[family][label] = {"interpolated": lomo,
                                    "extrapolated": max([lomo, *regions])}
    return found
