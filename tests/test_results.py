"""Recorded results: loading, provenance label, nearest recorded point on a log2 scale."""

import json
import re

import pytest

import kvlab.results
from kvlab.results import (
    label,
    load_result,
    load_results,
    nearest_point,
    nearest_rows,
    recorded_models,
    results_dir,
    speedups,
)


@pytest.fixture(scope="module")
def h200():
    return load_result("h200", "attention")


def make_result(points, model="m"):
    """A minimal result: one sdpa row per (batch, context)."""
    rows = [
        {"model": model, "batch": b, "context": c, "kernel": "sdpa", "prefetch": "none"}
        for b, c in points
    ]
    return {"gpu": "G", "date": "2026-01-02T03:04:05+00:00", "rows": rows}


def test_results_dir_holds_the_h200_attention_result():
    assert (results_dir() / "h200" / "attention.json").is_file()


def test_load_result_and_label(h200):
    assert h200["gpu"] == "NVIDIA H200" and h200["rows"]
    assert label(h200) == f"recorded on NVIDIA H200, {h200['date'][:10]}"
    assert recorded_models(h200) == ["llama2-7b", "llama3-8b", "qwen2.5-7b", "qwen2.5-14b"]


@pytest.mark.parametrize("machine,name", [("a100", "attention"), ("h200", "no_such_result")])
def test_load_result_unknown_names_machine_name_and_lists_recorded(machine, name):
    with pytest.raises(ValueError) as error:
        load_result(machine, name)
    message = str(error.value)
    assert f"machine={machine!r}" in message and f"name={name!r}" in message
    assert "h200/attention" in message


@pytest.mark.parametrize(
    "machine,name,bad",
    [
        ("h200", "../h200/attention", "name"),  # once loaded h200/attention.json by a detour
        ("h200", "../../pyproject", "name"),
        ("..", "attention", "machine"),
        ("h200/..", "attention", "machine"),
        (".", "attention", "machine"),
        ("h200", "..", "name"),
        ("", "attention", "machine"),
        ("h200", "/etc/passwd", "name"),
        ("h200", None, "name"),
    ],
)
def test_load_result_refuses_anything_but_plain_names(machine, name, bad):
    value = {"machine": machine, "name": name}[bad]
    message = f"{bad}={value!r}: must be a plain file name of letters, digits"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_result(machine, name)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_results(machine, ["attention", name])


def test_load_result_refuses_a_link_out_of_the_results_folder(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "h200").symlink_to(outside)
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path / "results")
    with pytest.raises(ValueError, match="machine='h200', name='secret': .* resolves outside"):
        load_result("h200", "secret")


def test_merged_results_are_labelled_with_every_date(tmp_path, monkeypatch):
    (tmp_path / "h200").mkdir()
    for name, date in (("a", "2026-11-29T15:00:00+00:00"), ("b", "2026-12-01T05:00:00+00:00"),
                       ("c", "2026-11-29T16:00:00+00:00")):
        result = {**make_result([(1, 1024)]), "gpu": "NVIDIA H200", "date": date}
        (tmp_path / "h200" / f"{name}.json").write_text(json.dumps(result))
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)
    assert label(load_results("h200", ["b", "a", "c"])) == (
        "recorded on NVIDIA H200, 2026-11-29 and 2026-12-01")
    assert label(load_results("h200", ["a", "c"])) == "recorded on NVIDIA H200, 2026-11-29"
    merged = load_results("h200", ["b", "a", "c"])
    rows_of_a = [r for r in merged["rows"] if r["source"] == "a"]
    assert label(merged, rows_of_a) == "recorded on NVIDIA H200, 2026-11-29"


def test_load_results_needs_a_name():
    with pytest.raises(ValueError, match=r"names=\[\]: must name at least one result"):
        load_results("h200", [])


@pytest.mark.parametrize(
    "batch,context,expected",
    [
        (100, 5000, (128, 4096)),  # log2: 100 is 0.36 from 128; 5000 is 0.29 from 4096
        (1, 1024, (1, 1024)),  # exact
        (1000, 10**6, (128, 32768)),  # beyond the grid: its corner
        (32, 1024, (16, 1024)),  # NOTE: tie between 16 and 64 goes to the smaller batch
        (4, 1024, (1, 1024)),  # NOTE: log2(4) = 2 is as far from 1 as from 16 -> smaller batch
        (3, 1500, (1, 1024)),  # log2(3) = 1.58: nearer 1 than 16
    ],
)
def test_nearest_point_on_log2_scale(h200, batch, context, expected):
    assert nearest_point(h200, "llama3-8b", batch, context) == expected


def test_nearest_point_skips_unrecorded_points():
    result = make_result([(b, c) for b in (1, 4) for c in (16, 64)][:-1])  # (4, 64) skipped
    # (4, 64) would be exact; (1, 64) and (4, 16) tie at distance 2: smaller batch wins.
    assert nearest_point(result, "m", 4, 64) == (1, 64)


def test_nearest_rows_are_the_point_rows_in_order(h200):
    rows = nearest_rows(h200, "qwen2.5-7b", 100, 5000)
    expected = [
        r
        for r in h200["rows"]
        if (r["model"], r["batch"], r["context"]) == ("qwen2.5-7b", 128, 4096)
    ]
    # 2 kernels x (7 prefetch settings + auto tuned, reused, recorded) + sdpa
    assert rows == expected and len(rows) == 21


def test_unknown_model_lists_recorded_models(h200):
    with pytest.raises(ValueError, match=r"model='opt-125m'.*llama3-8b"):
        nearest_rows(h200, "opt-125m", 16, 1024)


@pytest.mark.parametrize("batch,context", [(0, 1024), (16, -1), (16.0, 1024), (True, 1024)])
def test_bad_batch_or_context(h200, batch, context):
    with pytest.raises(ValueError, match="must be a positive integer"):
        nearest_point(h200, "llama3-8b", batch, context)


def test_importing_results_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, kvlab.results; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_speedups_compare_only_within_one_run():
    rows = [
        {"model": "m", "batch": 1, "context": 8, "kernel": "k", "block_size": 16,
         "prefetch": p, "ms": ms, "source": src}
        for p, ms, src in [("none", 2.0, "a"), ("bulk K+V d=1", 1.0, "a"),
                           ("none", 4.0, "b"), ("line K+V d=2", 1.0, "b")]
    ]
    gains = {r["prefetch"]: s for r, s in speedups(rows)}
    assert gains == {"none": 1.0, "bulk K+V d=1": 2.0, "line K+V d=2": 4.0}


def test_auto_rows_of_two_families_stay_apart():
    rows = [
        {"model": "m", "batch": 1, "context": 8, "kernel": "auto", "family": f, "block_size": 16,
         "prefetch": p, "ms": ms, "source": "a"}
        for f, p, ms in [("vllm_v1", "none", 2.0), ("gqa", "bulk K+V d=1", 1.0)]
    ]
    assert [r["family"] for r, _ in speedups(rows)] == ["vllm_v1"]  # gqa has no baseline
    assert nearest_rows({"rows": rows}, "m", 1, 8) == rows
