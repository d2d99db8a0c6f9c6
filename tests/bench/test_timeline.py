"""`python -m kvlab bench timeline`: models gqa cannot run refused by name (CPU); on the GPU, a
small run timing and tracing each point, and the report drawn from it."""

import json

import pytest

from kvlab.bench import timeline
from kvlab.bench.cli import main, parse
from kvlab.kernels.timeline import KERNELS


def test_points_default_to_the_small_shapes_of_issue_14():
    args = parse(["bench", "timeline"])
    assert args.points == [(1, 32768), (1, 8192), (16, 1024), (16, 4096)]
    assert args.runs == 25 and args.traces == 7


def test_a_model_gqa_cannot_run_is_refused_by_name(monkeypatch):
    from types import SimpleNamespace

    from kvlab.config import MODELS

    monkeypatch.setitem(MODELS, "wide", SimpleNamespace(head_dim=128, gqa_group=16))
    with pytest.raises(ValueError, match=r"--models wide: gqa runs head_dim .* and up to 8 query "
                                         r"heads a KV head \(wide: head_dim 128, 16\)"):
        timeline.check(SimpleNamespace(models=["wide"]))


@pytest.mark.gpu
def test_a_small_run_times_and_traces_each_point(tmp_path, capsys):
    out = tmp_path / "timeline.json"
    main(["bench", "timeline", "--json", str(out), "--models", "llama3-8b", "--points",
          "1x4096", "16x1024", "--runs", "3", "--traces", "3"])
    result = json.loads(out.read_text())
    assert result["benchmark"] == "timeline" and result["roofline_copy_gbps"] > 0
    split, whole = result["rows"]
    assert split["num_partitions"] > 1 and whole["num_partitions"] == 1
    for row in (split, whole):
        assert set(row["ms"]) == {"gqa", "read"} and len(row["ms_runs"]["gqa"]) == 3
        assert len(row["phases_runs"]) == 3
        assert row["phases"]["decode_ctas_done"] == row["phases"]["decode_ctas"]
        assert set(row["trace"]["decode"]) == {"sm", *KERNELS["decode"][1]}
        assert row["phases"]["step_span_us"] in [p["step_span_us"] for p in row["phases_runs"]]
    assert split["trace"]["merge"] is not None and whole["trace"]["merge"] is None
    assert "merge_end_after_us" in split["phases"]
    printed = capsys.readouterr().out
    assert "llama3-8b      1x4096" in printed and "issued" in printed
