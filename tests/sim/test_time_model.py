"""The L2 model's kernel time (kvlab.sim.time_model): the formula by hand, the recorded fit
reproducing the validation's predictions, and the copy roofline between measured SM counts."""

import re

import pytest

import kvlab.results
from kvlab.results import load_result
from kvlab.sim import L2Result
from kvlab.sim.time_model import TimeModel, copy_roofline_gbps

MODEL = TimeModel(50.0, {"gqa": 0.8}, {"gqa": 10.0})


def test_dram_bound_time():
    # 4 GB at 4,000 GB/s is 1 ms; the L2 side: 4 GB / (50 GB/s x 132) = 0.61 ms; / 0.8 + 10 us
    assert MODEL.predict_ms("gqa", 4e9, 4e9, 132, 4000.0) == pytest.approx(1 / 0.8 + 0.010)


def test_l2_bound_time():
    # loads 8x the DRAM bytes (a group of 8 re-reading one KV head): 8e9 / (50e9 x 32) = 5 ms
    assert MODEL.predict_ms("gqa", 1e9, 8e9, 32, 2000.0) == pytest.approx(5 / 0.8 + 0.010)


def test_a_result_is_timed_by_its_sectors():
    result = L2Result(demand_misses=1000)
    assert MODEL.predict_result_ms("gqa", result, 132, 4000.0) == pytest.approx(
        MODEL.predict_ms("gqa", 32_000, 32_000, 132, 4000.0))


def test_a_family_without_a_fit_is_refused():
    with pytest.raises(ValueError, match=re.escape(
            "family='vllm_v1': the time model is fitted for ['gqa']")):
        MODEL.predict_ms("vllm_v1", 1, 1, 1, 1.0)


def test_the_recorded_fit_gives_the_validations_predictions():
    validation = load_result("cpu", "l2_validation")
    attention = load_result("h200", "attention_sms")
    roofline = {attention["num_sms"]: attention["roofline_copy_gbps"],
                **{int(k): g for k, g in attention["roofline_copy_gbps_by_sms"].items()}}
    model = TimeModel.recorded()
    rows = [r for r in validation["rows"] if r.get("predicted_ms")]
    assert len(rows) >= 16
    for r in rows:
        assert model.predict_ms(r["kernel"], r["model_dram_bytes"], r["model_load_bytes"],
                                r["sms"], roofline[r["sms"]]) == pytest.approx(r["predicted_ms"])


def test_copy_roofline_between_measured_sm_counts():
    measured = {32: 2000.0, 80: 3800.0, 132: 4300.0}
    assert copy_roofline_gbps(80, measured) == 3800.0
    assert copy_roofline_gbps(56, measured) == pytest.approx(2900.0)  # halfway 32 -> 80
    assert copy_roofline_gbps(16, measured) == pytest.approx(1000.0)  # in proportion below
    assert copy_roofline_gbps(144, measured) == 4300.0  # flat above the most measured
    with pytest.raises(ValueError, match="num_sms=0: must be an integer >= 1"):
        copy_roofline_gbps(0, measured)
    with pytest.raises(ValueError, match="needs at least one measured SM count"):
        copy_roofline_gbps(8, {})


@pytest.mark.parametrize("text", ["{}", '{"time_model": []}', '{"time_model": {}}', "{tim"])
def test_a_bad_recorded_fit_is_a_value_error_naming_the_file(tmp_path, monkeypatch, text):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "l2_validation.json").write_text(text)
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)
    with pytest.raises(ValueError, match="l2_validation.json|time_model|fit="):
        TimeModel.recorded()
