"""The fit (kvlab.predict.fit, validate): deterministic, reproducing predict.json's constants and
measured inputs, and its held-out errors no worse than the committed table's."""

import functools

import numpy as np
import pytest

from kvlab.predict import fit, validate
from kvlab.predict.closed_form import FamilyFit, stack, time_s
from kvlab.predict.recorded import FITTED, recorded
from kvlab.results import load_result

SLACK = 0.002  # of a relative error: numpy's sums may differ in the last digits across builds


@functools.cache
def committed() -> dict:
    return load_result("cpu", "predict")


@functools.cache
def all_samples() -> list:
    return fit.samples(recorded(FITTED), fit.rooflines_by_sms())


def test_the_measured_inputs_are_the_committed_ones():
    assert fit.kappa_from_counters() == committed()["kappa"]
    assert fit.rooflines_by_sms() == {int(k): v for k, v in
                                      committed()["rooflines_by_sms"].items()}
    assert len(all_samples()) == committed()["launches"]


def test_the_fit_is_deterministic_and_reproduces_the_committed_constants():
    kappa = fit.kappa_from_counters()
    first, second = fit.fit(all_samples(), kappa), fit.fit(all_samples(), kappa)
    for family, found in first.items():
        assert found == second[family]
        mine, theirs = found.as_dict(), committed()["fit"][family]
        for name, value in mine.items():
            if name == "prefetch":
                for label, pair in value.items():
                    assert pair == pytest.approx(theirs[name][label], rel=1e-3), (family, label)
            elif name != "kappa":
                assert value == pytest.approx(theirs[name], rel=1e-3), (family, name)


def test_held_out_errors_stay_within_the_committed_table():
    found = validate.errors(all_samples(), fit.kappa_from_counters())
    for family, rows in committed()["errors"].items():
        for label, checks in rows.items():
            for check, summary in checks.items():
                mine = found[family][label][check]
                assert (mine is None) == (summary is None), (family, label, check)
                if summary is not None:
                    assert mine["n"] == summary["n"]
                    for stat in ("median", "p90"):
                        assert mine[stat] <= summary[stat] + SLACK, (family, label, check, stat)


def test_each_model_held_out_stays_within_the_committed_errors():
    found = validate.by_model(all_samples(), fit.kappa_from_counters())
    for family, models in committed()["one_model_out_by_model"].items():
        for model, summary in models.items():
            assert found[family][model]["n"] == summary["n"]
            assert found[family][model]["p90"] <= summary["p90"] + SLACK, (family, model)


def test_one_model_out_never_sees_the_model_it_predicts():
    kappa = fit.kappa_from_counters()
    errors = validate.held_out(all_samples(), kappa,
                               lambda s: s.recorded.point.model == "qwen2.5-7b")
    inside = np.array([s.recorded.point.model == "qwen2.5-7b" for s in all_samples()])
    assert np.isnan(errors[~inside]).all() and not np.isnan(errors[inside]).any()
    # the same errors by hand: fit the other models, predict this one's launches
    fits = fit.fit([s for s, i in zip(all_samples(), inside, strict=True) if not i], kappa)
    one = next(s for s, i in zip(all_samples(), inside, strict=True) if i)
    ms = 1e3 * time_s(stack([one.launch]), fits[one.family], one.prefetch)[0]
    assert errors[np.flatnonzero(inside)[0]] == pytest.approx(abs(ms / one.recorded.ms - 1))


def test_bands_are_the_held_out_percentiles():
    table = committed()["errors"]
    bands = validate.bands(table)
    assert bands == committed()["bands"]
    row = table["gqa"]["none"]
    assert bands["gqa"]["none"] == {
        "interpolated": row["one model out"]["p90"],
        "extrapolated": max(row[c]["p90"] for c in ("one model out", *validate.REGIONS))}


def test_least_squares_finds_a_known_minimum():
    x = np.linspace(0, 1, 20)
    theta = fit.least_squares(lambda t: t[0] * np.exp(t[1] * x) - 2 * np.exp(-3 * x),
                              np.array([1.0, 0.0]))
    assert theta == pytest.approx([2.0, -3.0], abs=1e-6)


def test_a_family_fit_survives_json():
    found = fit.fit(all_samples(), fit.kappa_from_counters())["vllm_v1"]
    assert FamilyFit.from_dict(committed()["fit"]["vllm_v1"]).prefetch.keys() == \
        found.prefetch.keys()
    with pytest.raises(ValueError, match="must be a dict of"):
        FamilyFit.from_dict({"launch_us": 1.0})
