"""The paper's H20 beside the model (kvlab.predict.paper): the published figures are the paper's
(Table 5.2 of arXiv 2504.06319, as its summary prints them), the predicted ones come from the
model, and docs/predict.md is what the code makes of predict.json."""

import functools
from pathlib import Path

import pytest

from kvlab.predict import decode_launch, paper, report
from kvlab.results import load_result

ROOT = Path(__file__).resolve().parents[2]
# Table 5.2 as seeds/000_f04b904209b8b24f.txt prints it: speedup, L2 hit rate, memory throughput
PUBLISHED = {
    "llama2-7b": (1.84, (0.06, 43.70), (47.10, 86.88)),
    "llama3-8b": (1.89, (38.35, 73.01), (23.44, 66.96)),
    "qwen2.5-7b": (2.15, (55.90, 82.66), (20.05, 63.50)),
    "qwen2.5-14b": (1.89, (51.43, 77.11), (24.16, 68.44)),
}


@functools.cache
def result() -> dict:
    return load_result("cpu", "predict")


@functools.cache
def rows() -> tuple:
    return tuple(paper.rows(result()["h20_replay"]))


def _one(metric: str, model: str) -> dict:
    return next(r for r in rows() if (r["metric"], r["model"]) == (metric, model))


@pytest.mark.parametrize("model", list(PUBLISHED))
def test_the_published_figures_are_the_papers(model):
    speedup, hits, memory = PUBLISHED[model]
    assert _one("kernel speedup", model)["published"] == speedup
    assert _one("kernel speedup, best point", model)["published"] == speedup
    assert tuple(_one("L2 hit rate, %", model)["published"]) == hits
    assert tuple(_one("memory throughput, %", model)["published"]) == memory
    assert _one("CPI", model)["predicted"] is None  # not modelled, and said so


@pytest.mark.parametrize("model", list(PUBLISHED))
def test_the_predicted_figures_come_from_the_model(model):
    times = [decode_launch(model, 16, 4096, family="vllm_v1", prefetch=p, gpu="h20")
             for p in ("none", "bulk K+V d=1")]
    assert all(t.source == "extrapolated" and "gpu" in t.extrapolated for t in times)
    assert _one("kernel speedup", model)["predicted"] == round(
        times[0].time_ms / times[1].time_ms, 3)
    assert _one("memory throughput, %", model)["predicted"] == tuple(
        round(100 * t.gbps / 4000.0, 1) for t in times)
    best = _one("kernel speedup, best point", model)
    assert best["predicted"] >= _one("kernel speedup", model)["predicted"]
    assert best["predicted"] == max(round(paper._speedup_or_zero(model, *p), 3)
                                    for p in paper.GRID)
    replayed = result()["h20_replay"][model]
    assert _one("L2 hit rate, %", model)["predicted"] == (
        replayed["none"]["ncu_hit_pct"], replayed["bulk K+V d=1"]["ncu_hit_pct"])


def test_the_stored_replay_is_the_l2_models():
    # the quickest of the eight (GQA 7:1, 4 KV heads): seconds with Numba's first compile
    assert paper.replay("qwen2.5-7b", "none") == result()["h20_replay"]["qwen2.5-7b"]["none"]


def test_the_recorded_lift_is_attention_sms():
    assert paper.recorded_speedups() == result()["h200_prefetch_speedups"]


def test_docs_predict_md_is_what_the_code_makes():
    assert (ROOT / "docs" / "predict.md").read_text() == report.markdown(result())
