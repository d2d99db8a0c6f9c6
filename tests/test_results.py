"""Recorded results: loading, provenance label (date, revision, components changed since), the
manifest of every result, nearest recorded point on a log2 scale."""

import json
import os
import re

import numpy as np
import pytest

import kvlab.results
from kvlab.results import (
    changed_since,
    label,
    load_result,
    load_results,
    manifest,
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
    head = f"recorded on NVIDIA H200, {h200['date'][:10]} at bcfeff1"
    if changed_since(h200):
        assert label(h200).startswith(f"{head}; ") and label(h200).endswith(" changed since")
    else:
        assert label(h200) == head
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
        "recorded on NVIDIA H200, 2026-11-29 and 2026-12-01; no revision recorded")
    assert label(load_results("h200", ["a", "c"])) == (
        "recorded on NVIDIA H200, 2026-11-29; no revision recorded")
    merged = load_results("h200", ["b", "a", "c"])
    rows_of_a = [r for r in merged["rows"] if r["source"] == "a"]
    assert label(merged, rows_of_a) == "recorded on NVIDIA H200, 2026-11-29; no revision recorded"


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


def write_results(tmp_path, monkeypatch, files: dict[str, bytes]):
    """A results folder of its own holding `files` ({"machine/name": bytes of the .json})."""
    for where, data in files.items():
        path = tmp_path / f"{where}.json"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)


GOOD = json.dumps(make_result([(1, 1024)])).encode()


@pytest.mark.parametrize("data,why", [
    (GOOD[:40], "not a JSON recording: "),  # truncated
    (b"", "not a JSON recording: "),
    (b"\xff\xfe{}", "not a JSON recording: "),  # not UTF-8
    (b"[" * 100_000, "not a JSON recording: "),  # nested past the parser's recursion limit
    (b"[]", "holds a JSON array: must hold an object"),
    (b"null", "holds a JSON null: must hold an object"),
    (b'"text"', "holds a JSON string: must hold an object"),
    (b'{"rows": {}}', "'rows' holds a JSON object: must be an array of objects"),
    (b'{"rows": 5}', "'rows' holds a JSON number: must be an array of objects"),
    (b'{"rows": [1]}', "rows[0] = 1: must be an object"),
    (b'{"rows": [{"model": "m"}, [1, 2]]}', "rows[1] = [1, 2]: must be an object"),
    (b'{"rows": [], "timelines": [null]}', "timelines[0] = null: must be an object"),
])
def test_a_bad_file_is_a_value_error_naming_it(tmp_path, monkeypatch, data, why):
    write_results(tmp_path, monkeypatch, {"h200/bad": data, "h200/good": GOOD})
    path = tmp_path / "h200" / "bad.json"
    for load in (lambda: load_result("h200", "bad"), lambda: load_results("h200", ["good", "bad"]),
                 lambda: kvlab.results.load_recorded("h200", ["bad", "absent"])):
        with pytest.raises(ValueError, match=re.escape(f"{path}: ") + ".*" + re.escape(why)):
            load()


ROW_KEYS = {"rows": ("model", "batch", "context", "ms")}


@pytest.mark.parametrize("result,keys,why", [
    ({}, ROW_KEYS, "no key 'rows': must have the keys ['rows']"),
    ({"rows": [{"model": "m", "batch": 1, "context": 8}]}, ROW_KEYS,
     "rows[0] = {\"model\": \"m\", \"batch\": 1, \"context\": 8}: must be an object with the keys "
     "['model', 'batch', 'context', 'ms']; missing ['ms']"),
    ({"rows": [{"model": "m", "batch": 1, "context": 8, "ms": 1.0}], "x": 1}, {"x": str},
     "x=1: must be a string"),
    ({"x": "fast"}, {"x": float}, 'x="fast": must be a finite number'),
    ({"x": float("nan")}, {"x": float}, "x=NaN: must be a finite number"),
    ({"x": True}, {"x": float}, "x=true: must be a finite number"),
    ({"x": 1.5}, {"x": int}, "x=1.5: must be an integer"),
    ({"x": []}, {"x": dict}, "x=[]: must be an object"),
    ({"serving": [{"model": "m"}, {}]}, {"serving": ("model",)},
     "serving[1] = {}: must be an object with the keys ['model']; missing ['model']"),
])
def test_a_result_without_what_the_caller_reads_is_a_value_error_naming_file_and_key(
        tmp_path, monkeypatch, result, keys, why):
    write_results(tmp_path, monkeypatch, {"h200/bad": json.dumps(result).encode()})
    message = f"{tmp_path / 'h200' / 'bad.json'}: {why}"
    with pytest.raises(ValueError, match=re.escape(message)):
        load_result("h200", "bad", keys)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_results("h200", ["bad"], keys)


def test_what_the_caller_reads_passes_and_the_result_is_as_recorded(tmp_path, monkeypatch):
    result = {**make_result([(1, 1024)]), "roofline": 3000, "serving": []}
    write_results(tmp_path, monkeypatch, {"h200/good": json.dumps(result).encode()})
    keys = {"rows": ("model", "batch"), "roofline": float, "serving": ("rate",), "gpu": object}
    assert load_result("h200", "good", keys) == result
    assert load_results("h200", ["good"], keys)["rows"] == [
        {**r, "source": "good"} for r in result["rows"]]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_a_value_error_naming_it(tmp_path, monkeypatch):
    write_results(tmp_path, monkeypatch, {"h200/locked": GOOD})
    path = tmp_path / "h200" / "locked.json"
    path.chmod(0)
    with pytest.raises(ValueError, match=re.escape(f"{path}: unreadable: Permission denied")):
        load_result("h200", "locked")


def test_load_recorded_is_none_where_nothing_is_recorded(tmp_path, monkeypatch):
    write_results(tmp_path, monkeypatch, {"h200/good": GOOD})
    assert kvlab.results.load_recorded("h200", ["absent", "also_absent"]) is None
    assert kvlab.results.load_recorded("h200", ["absent", "good"])["rows"] == [
        {**r, "source": "good"} for r in json.loads(GOOD)["rows"]]
    with pytest.raises(ValueError, match="names=\\[\\]"):
        kvlab.results.load_recorded("h200", [])
    with pytest.raises(ValueError, match="name='../good': must be a plain file name"):
        kvlab.results.load_recorded("h200", ["../good"])


@pytest.mark.parametrize("bad", ["machine", "name"])
def test_over_long_names_are_refused_as_other_bad_names(bad):
    names = {"machine": "h200", "name": "attention", bad: "a" * 300}
    message = f"{bad}='{'a' * 56}...: must be a plain file name of letters, digits"
    with pytest.raises(ValueError, match=re.escape(message) + ".*at most 128 characters"):
        load_result(**names)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_results(names["machine"], [names["name"]])


@pytest.mark.parametrize("batch,context,expected", [
    (np.int64(100), np.int32(5000), (128, 4096)),  # numpy integers, as a slider may give
    (np.uint16(1), 1024, (1, 1024)),
    (2**70, 2**70, (128, 32768)),  # huge: the grid's corner
    pytest.param(2**2000, 1, (128, 1024), id="2**2000"),  # past a float's range
])
def test_nearest_point_takes_any_integer(h200, batch, context, expected):
    assert nearest_point(h200, "llama3-8b", batch, context) == expected


@pytest.mark.parametrize("batch,context", [(np.float64(16), 1024), (np.bool_(True), 1024),
                                           (16, float("nan")), (16, "1024"), (None, 1024)])
def test_nearest_point_refuses_what_is_not_an_integer(h200, batch, context):
    with pytest.raises(ValueError, match="must be a positive integer"):
        nearest_point(h200, "llama3-8b", batch, context)


def test_load_shown_keeps_why_a_recording_cannot_be_read_for_its_view(tmp_path, monkeypatch):
    write_results(tmp_path, monkeypatch, {"h200/good": GOOD, "h200/bad": b"{"})
    unreadable = {}
    assert kvlab.results.load_shown("h200", ["absent"], None, unreadable, "a") is None
    assert kvlab.results.load_shown("h200", ["good"], {"rows": ("model",)}, unreadable, "b")
    assert unreadable == {}
    assert kvlab.results.load_shown("h200", ["good", "bad"], None, unreadable, "c") is None
    assert list(unreadable) == ["c"]
    assert unreadable["c"].startswith(f"{tmp_path / 'h200' / 'bad.json'}: not a JSON recording")


# The code now, for the tests of staleness: three components, one this install cannot read
NOW = {"gqa": "1" * 12, "vllm_v1": "2" * 12, "engine": "3" * 12, "numba": None}
REVISION = "abcdef1" + "0" * 33


def coded(components=None, benchmark="attention", **keys) -> dict:
    """A result of `benchmark` at REVISION recording `components` (NOW's by default)."""
    found = {k: v for k, v in NOW.items() if v is not None}
    return {**make_result([(1, 1024)]), "benchmark": benchmark, "git_revision": REVISION,
            "git_dirty": False, "components": found if components is None else components,
            **keys}


@pytest.fixture
def now(monkeypatch):
    monkeypatch.setattr(kvlab.results, "versions", lambda: NOW)


def test_changed_since_lists_the_benchmarks_components_that_differ(now):
    assert changed_since(coded()) == []
    assert changed_since(coded({**coded()["components"], "vllm_v1": "f" * 12})) == ["vllm_v1"]
    # absent at the revision (None) or not recorded: changed
    assert changed_since(coded({"gqa": None, "engine": NOW["engine"]})) == ["gqa", "vllm_v1"]
    # engine is no part of attention; a component this install cannot read is not known changed
    assert changed_since(coded({"gqa": NOW["gqa"], "vllm_v1": NOW["vllm_v1"], "engine": "x",
                                "numba": "y"})) == []
    assert changed_since(coded({"engine": "x"}, benchmark="e2e")) == ["gqa", "vllm_v1", "engine"]
    # a benchmark not in the table: every component it records
    assert changed_since(coded({"engine": "x", "gqa": NOW["gqa"]}, benchmark="new")) == [
        "engine"]


def test_changed_since_is_none_without_recorded_components(now):
    assert changed_since(make_result([(1, 1)])) is None
    assert changed_since(coded() | {"components": None}) is None


def test_label_names_revision_dirty_tree_and_what_changed(now):
    where = "recorded on G, 2026-01-02"
    assert label(coded()) == f"{where} at abcdef1"
    assert label(coded({"gqa": "x"})) == f"{where} at abcdef1; gqa, vllm_v1 changed since"
    assert label(coded({"gqa": "x"}), changes=False) == f"{where} at abcdef1"
    # names as fit in LABEL_CHARS (a chart's subtitle line), then how many more
    assert label(coded({"gqa": "x"}, benchmark="e2e")) == (
        f"{where} at abcdef1; gqa and 2 more changed since")
    assert label(coded(git_dirty=True)) == (
        f"{where} at abcdef1; recorded on a tree with uncommitted changes")
    assert label(make_result([(1, 1)])) == f"{where}; no revision recorded"
    assert label(coded() | {"components": None}) == (
        f"{where} at abcdef1; no code versions recorded")


def test_label_names_what_fits_a_chart_line_and_counts_the_rest(monkeypatch):
    names = ["gqa", "vllm_v1", "vllm_own", "read", "green"]
    monkeypatch.setattr(kvlab.results, "versions", lambda: dict.fromkeys(names, "new"))
    result = coded(dict.fromkeys(names, "old")) | {"gpu": "H"}
    assert changed_since(result) == names  # in the table's order
    assert label(result) == "recorded on H, 2026-01-02 at abcdef1; gqa and 4 more changed since"
    assert len(label(result)) <= kvlab.results.LABEL_CHARS
    assert label(result | {"gpu": "NVIDIA H200"}) == (
        "recorded on NVIDIA H200, 2026-01-02 at abcdef1; code changed since")
    assert label(coded({**dict.fromkeys(names, "new"), "gqa": "old"}) | {"gpu": "NVIDIA H200"}) == (
        "recorded on NVIDIA H200, 2026-01-02 at abcdef1; gqa changed since")


def test_merged_results_label_each_revision_and_the_changes_of_each(tmp_path, monkeypatch, now):
    (tmp_path / "h200").mkdir()
    other = "1234567" + "0" * 33
    for name, result in (("a", coded({"gqa": "old"}, git_revision=other)),
                         ("b", coded(git_dirty=True)),
                         ("c", make_result([(2, 1024)]) | {"gpu": "G"})):
        (tmp_path / "h200" / f"{name}.json").write_text(json.dumps(result))
    monkeypatch.setattr(kvlab.results, "results_dir", lambda: tmp_path)
    assert label(load_results("h200", ["a", "b"])) == (
        "recorded on G, 2026-01-02 at 1234567, abcdef1; recorded on a tree with uncommitted "
        "changes; code changed since")
    assert changed_since(load_results("h200", ["a", "b"])) == ["gqa", "vllm_v1"]
    merged = load_results("h200", ["a", "b", "c"])
    assert changed_since(merged) is None
    assert label(merged) == ("recorded on G, 2026-01-02 at 1234567, abcdef1; no revision recorded "
                             "for c; recorded on a tree with uncommitted changes; code changed "
                             "since")
    rows_of_b = [r for r in merged["rows"] if r["source"] == "b"]
    assert label(merged, rows_of_b) == (
        "recorded on G, 2026-01-02 at abcdef1; recorded on a tree with uncommitted changes")


def test_manifest_lists_every_committed_result_with_its_code():
    entries = {e["file"]: e for e in manifest()}
    files = {f"{p.parent.name}/{p.name}" for p in results_dir().glob("*/*.json")}
    assert set(entries) == files and len(entries) == len(manifest())
    unrevised = {"h200/attention_block_sizes.json", "h200/attention_evict_last.json"}
    for name, e in entries.items():
        assert e["benchmark"] and re.fullmatch(r"\d{4}-\d{2}-\d{2}", e["date"]) and e["gpu"]
        if name in unrevised:
            assert e["revision"] is None and e["dirty"] is None and e["changed"] is None
        else:
            assert re.fullmatch(r"[0-9a-f]{7}", e["revision"]) and isinstance(e["changed"], list)
    assert {n for n, e in entries.items() if e["revision"] is None} == unrevised
    assert {n for n, e in entries.items() if e["dirty"]} == {"h200/attention_vllm.json"}
    assert label(load_result("h200", "attention_evict_last")).endswith("; no revision recorded")
    assert "; recorded on a tree with uncommitted changes" in label(
        load_result("h200", "attention_vllm"))


def test_every_committed_result_records_its_components():
    """New recordings record them (kvlab.bench.env.run_info); older ones were backfilled by
    benchmarks/manifest.py, or hold null where no revision tells which code ran."""
    for path in results_dir().glob("*/*.json"):
        result = json.loads(path.read_text())
        assert "components" in result, path
        assert (result["components"] is None) == (result.get("git_revision") is None), path
