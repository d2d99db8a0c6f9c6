"""`python -m kvlab bench kvpr`: the split of each setting, the overlap measure (CPU), and a tiny
run of the whole harness (GPU)."""

import json

import pytest

from kvlab.__main__ import main
from kvlab.bench.kvpr import SETTINGS, overlap, split_for
from kvlab.config import MODELS
from kvlab.offload.scheduler import LayerShape, LinkAndCompute, best_split

HW = LinkAndCompute(55.4e9, 670e12, "what-if")


def test_each_setting_runs_its_split():
    shape = LayerShape(MODELS["opt-6.7b"], 16, 1024)
    assert split_for("full-transfer", shape, HW, 4) == 0
    assert split_for("full-recompute", shape, HW, 4) == 1024
    for model in ("paper", "chunked", "pipelined"):
        assert split_for(f"kvpr-{model}", shape, HW, 4) == best_split(shape, HW, model, 4).l


def span(lane, start, end):
    return {"lane": lane, "name": "x", "layer": 0, "start_us": start, "end_us": end}


@pytest.mark.parametrize(
    ("spans", "expected"),
    [
        ([span("H2D", 0, 100), span("compute", 0, 40)], 1.0),  # all compute under the link
        ([span("H2D", 0, 100), span("compute", 100, 140)], 0.0),  # one after the other
        ([span("H2D", 0, 100), span("compute", 80, 120)], 0.5),  # half of it
    ],
)
def test_overlap_is_the_hidden_share_of_the_shorter_activity(spans, expected):
    got = overlap(spans)
    assert got["overlap"] == pytest.approx(expected)
    assert got["link_busy_ms"] == pytest.approx(0.1)


@pytest.mark.gpu
def test_tiny_kvpr_benchmark_runs_every_setting(tmp_path, capsys):
    out = tmp_path / "kvpr.json"
    main(["bench", "kvpr", "--json", str(out), "--models", "tiny-llama", "tiny-opt",
          "--batches", "2", "--contexts", "64", "--steps", "2"])
    result = json.loads(out.read_text())
    assert [r["setting"] for r in result["rows"]] == list(SETTINGS) * 2
    for r in result["rows"]:
        assert r["step_ms"] > 0 and 0 <= r["overlap"] <= 1 and 0 <= r["l"] <= 64
    assert "kvpr-pipelined" in capsys.readouterr().out
