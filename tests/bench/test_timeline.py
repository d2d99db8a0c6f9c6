"""`python -m kvlab bench timeline`: models gqa cannot run refused by name (CPU); on the GPU, a
small run timing and tracing each point, and the report drawn from it."""

import json

import pytest

from kvlab.bench import timeline
from kvlab.bench.cli import main, parse
from kvlab.kernels.timeline import KERNELS


def test_points_default_to_the_small_shapes_of_issue_14():
    args = parse(["bench", "timeline"])
    assert timeline.shapes(args) == [(1, 32768), (1, 8192), (16, 1024), (16, 4096)]
    assert args.runs == 25 and args.traces == 7
    args = parse(["bench", "timeline", "--points", "2x64"])
    assert timeline.shapes(args) == [(2, 64)]


def test_mixed_lengths_run_at_each_batch_size():
    args = parse(["bench", "timeline", "--lengths", "lognormal:3200,16384"])
    assert timeline.shapes(args) == [(16, "lognormal:3200,16384"), (64, "lognormal:3200,16384")]
    args = parse(["bench", "timeline", "--lengths", "lognormal:10,20", "--batches", "3"])
    assert timeline.shapes(args) == [(3, "lognormal:10,20")]


@pytest.mark.parametrize(("argv", "message"), [
    (["--points", "1x64", "--lengths", "lognormal:10,20"], "--points and --lengths: give one"),
    (["--batches", "4"], "--batches: the sizes of the --lengths batches"),
])
def test_points_given_two_ways_are_refused(argv, message):
    args = parse(["bench", "timeline", *argv])
    with pytest.raises(ValueError, match=message):
        timeline.check(args)


def test_a_model_gqa_cannot_run_is_refused_by_name(monkeypatch):
    from types import SimpleNamespace

    from kvlab.config import MODELS

    monkeypatch.setitem(MODELS, "wide", SimpleNamespace(head_dim=128, gqa_group=16))
    with pytest.raises(ValueError, match=r"--models wide: gqa runs head_dim .* and up to 8 query "
                                         r"heads a KV head \(wide: head_dim 128, 16\)"):
        timeline.check(SimpleNamespace(models=["wide"], points=None, lengths=None, batches=None))


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


@pytest.mark.gpu
def test_a_batch_of_mixed_lengths_is_traced_on_its_lengths(tmp_path):
    from kvlab.workload import lognormal_lengths

    out = tmp_path / "timeline.json"
    main(["bench", "timeline", "--json", str(out), "--models", "qwen2.5-7b", "--lengths",
          "lognormal:512,2048", "--batches", "8", "--runs", "3", "--traces", "2"])
    (row,) = json.loads(out.read_text())["rows"]
    lengths = lognormal_lengths(8, 512, 2048)
    assert row["lengths"] == "lognormal:512,2048" and row["max_context"] == lengths.max()
    assert row["context"] == round(float(lengths.mean()))
    assert row["kv_bytes"] == 2 * int(lengths.sum()) * 4 * 128 * 2
    assert row["phases"]["decode_ctas_done"] == row["phases"]["decode_ctas"]
