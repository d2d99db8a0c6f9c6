"""`python -m kvlab bench counters`: its options, the launches it plans, Table 5.2 beside the
paper's figures, and its report (CPU, no ncu)."""

import json
import random
import sys
from dataclasses import asdict

import pytest

from kvlab.bench import counters
from kvlab.bench.cli import parse
from kvlab.profile import paper
from kvlab.profile.ncu import METRICS


def args(*argv):
    return parse(["bench", "counters", *argv])


def test_defaults_are_the_papers_models_and_prefetch_on_both_families():
    groups = counters.settings(args())
    assert len(groups) == 4 * 2 * 2  # models x families x points
    assert {name for name, _ in groups} == set(paper.MODELS)
    for _, specs in groups:
        assert [s.prefetch for s in specs] == ["none", "bulk K+V d=1"]
        assert specs[0].num_sms is None and specs[0].block_size == 16


def test_sms_and_prefetch_settings_multiply_the_launches():
    groups = counters.settings(args("--models", "llama3-8b", "--families", "gqa", "--sms", "78",
                                    "32", "--prefetch", "bulk K+V d=1", "line K d=2"))
    assert [specs[0].num_sms for _, specs in groups] == [78, 32, 78, 32]
    assert [s.prefetch for s in groups[0][1]] == ["none", "bulk K+V d=1", "line K d=2"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--prefetch", "none"], "'none': must be a prefetch setting's label"),
    (["--prefetch", "bulk"], "'bulk': must be a prefetch setting's label"),
    (["--timeout", "0"], "'0': must be a number > 0"),
    (["--points", "16x"], "must be BATCHxCONTEXT"),
])
def test_bad_options_end_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        args(*argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_shape_the_kernels_cannot_run_is_refused_before_any_launch():
    with pytest.raises(ValueError, match="block_size=64"):
        counters.check(args("--families", "vllm_v1", "--block-size", "64"))


def fake_rows(groups, seed=0):
    rng = random.Random(seed)
    rows = []
    for name, specs in groups:
        for spec in specs:
            row = {"model": name, **asdict(spec), "num_sms_used": spec.num_sms or 132,
                   "kernel_name": "k"}
            rows.append({**row, **{column: rng.uniform(1, 50) for column in METRICS}})
    return rows


def test_table_sets_each_counter_beside_the_papers_and_the_speedup_from_durations():
    groups = counters.settings(args("--models", "llama2-7b", "tiny-llama", "--families",
                                    "vllm_v1", "--points", "16x4096"))
    rows = fake_rows(groups)
    table = counters.table(rows)
    llama = [e for e in table if e["model"] == "llama2-7b"]
    assert [e["column"] for e in llama] == [*paper.ROWS, "speedup"]
    hits = llama[0]
    base, with_prefetch = (r for r in rows if r["model"] == "llama2-7b")
    assert (hits["paper_baseline"], hits["paper_prefetch"]) == (0.06, 43.70)
    assert hits["ours_prefetch"] == with_prefetch["l2_hit_pct"]
    assert hits["ratio_baseline"] == pytest.approx(base["l2_hit_pct"] / 0.06)
    speedup = llama[-1]
    assert speedup["ours_prefetch"] == pytest.approx(base["duration_us"] /
                                                     with_prefetch["duration_us"])
    assert speedup["ratio_prefetch"] == pytest.approx(speedup["ours_prefetch"] / 1.84)
    tiny = [e for e in table if e["model"] == "tiny-llama"]
    assert tiny and all(e["paper_prefetch"] is None and e["ratio_prefetch"] is None
                        for e in tiny)  # the paper has no tiny-llama: no figure invented


def test_report_is_json_able_and_names_the_skipped(monkeypatch):
    groups = counters.settings(args("--models", "llama2-7b", "--families", "gqa",
                                    "--points", "16x4096"))
    result = {"gpu": "NVIDIA H200", "ncu": "Version 2025.3", "table":
              counters.table(fake_rows(groups)),
              "skipped": [{"model": "llama2-7b", **asdict(groups[0][1][1]),
                           "reason": "ncu ran past timeout_s=300.0; killed it"}]}
    json.dumps(result)
    text = counters.report(result)
    assert text.splitlines()[0].startswith("NVIDIA H200: ncu counters of one decode launch")
    assert "l2_hit_pct" in text and "0.06" in text
    assert text.splitlines()[-1].endswith("prefetch=bulk K+V d=1: ncu ran past timeout_s=300.0; "
                                          "killed it")


def test_importing_the_benchmark_loads_no_torch_or_pandas():
    import subprocess

    code = ("import sys, kvlab.bench.counters; "
            "print([m for m in ('torch', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr
