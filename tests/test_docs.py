"""The READMEs' tables are the recorded data: each line `benchmarks/tables.py` makes from the
committed results appears in the README that shows it, digit for digit (CPU)."""

import importlib.util
from pathlib import Path

import pytest

from kvlab.results import load_result, load_results

ROOT = Path(__file__).resolve().parents[1]


def tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "benchmarks" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("readme", "make"),
    [
        ("README.md", lambda t: t.decode_table(load_result("h200", "attention"))),
        ("benchmarks/README.md", lambda t: t.kvpr_table(
            {name: load_result("h200", name) for name in ("kvpr_opt", "kvpr_llama")})),
        ("benchmarks/README.md", lambda t: t.dashboard_table(load_result("cpu", "dashboard"))),
        ("benchmarks/README.md", lambda t: t.kvpr_table_1("spec")),
        ("benchmarks/README.md", lambda t: t.fp8_table(load_result("h200", "attention_fp8"))),
        ("benchmarks/README.md", lambda t: t.vllm_table(load_result("h200", "attention_vllm"),
                                                        load_result("h200", "vllm_own"))),
        ("benchmarks/README.md", lambda t: t.e2e_table(load_results("h200", t.E2E_RESULTS))),
        ("benchmarks/README.md", lambda t: t.e2e_table(load_result("h200", "e2e_2048"))),
        ("benchmarks/README.md", lambda t: t.serving_table(load_result("h200", "e2e_serving"))),
        ("benchmarks/README.md", lambda t: t.small_table(
            load_result("h200", "attention_small"))),
        ("benchmarks/README.md", lambda t: t.mixed_table(
            load_result("h200", "attention_mixed"))),
        ("benchmarks/README.md", lambda t: t.block_order_table(
            load_result("h200", "attention_block_order"))),
        ("benchmarks/README.md", lambda t: t.read_table(load_result("h200", "attention_read"))),
        ("benchmarks/README.md", lambda t: t.roofline_targets_table(
            load_result("h200", "attention_small"), load_result("h200", "attention_mixed"))),
        ("benchmarks/README.md", lambda t: t.ratio_targets_table(*(
            load_result("h200", name) for name in t.RATIO_TARGET_RESULTS))),
        ("benchmarks/README.md", lambda t: t.timeline_table(load_result("h200", "timeline"))),
        ("benchmarks/README.md", lambda t: t.timeline_table(
            load_result("h200", "timeline_mixed"))),
        ("benchmarks/README.md", lambda t: t.l2_validation_table(
            load_result("cpu", "l2_validation"))),
        ("benchmarks/README.md", lambda t: t.table_5_2(load_result("h200", "counters"))),
        ("benchmarks/README.md", lambda t: t.regime_summary_table(
            load_result("h200", "attention_sms"), load_result("h200", "counters_sms"))),
        ("benchmarks/README.md", lambda t: t.regime_table(
            load_result("h200", "attention_sms"), load_result("h200", "counters_sms"))),
    ],
)
def test_readme_tables_are_the_recorded_data(readme, make):
    text = (ROOT / readme).read_text().splitlines()
    for line in make(tables()):
        assert line in text, f"{readme} lacks: {line}"


def test_auto_table_is_the_recorded_data():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    summary = tables().auto_summary(load_result("h200", "attention"))
    labels = {"tuned": "tuned at the point",
              "reused": "tuned at 3/4 of the context, reused at the point",
              "recorded": "`KVLAB_AUTOTUNE=0` (the recorded choice)"}
    for mode, (worst, median, within, total) in summary.items():
        line = f"| {labels[mode]} | {worst:.3f}x | {median:.3f}x | {within} of {total} |"
        assert line in text, f"benchmarks/README.md lacks: {line}"


def test_roofline_targets_table_tells_a_miss_the_read_allows_from_one_it_does_not():
    def point(model, batch, context, gqa, read):
        return [{"model": model, "batch": batch, "context": context, "kernel": kernel,
                 "prefetch": "none", "pct_roofline": pct} for kernel, pct in (("gqa", gqa),
                                                                              ("read", read))]

    small = {"rows": point("llama3-8b", 1, 32768, 80.0, 91.0) + point("llama3-8b", 16, 1024,
                                                                      69.9, 79.0)}
    mixed = {"rows": [dict(r, lengths=spec) for batch, spec, gqa, read in (
        (16, "lognormal:3200,16384", 76.5, 90.0), (16, "lognormal:1536,2048", 60.0, 77.0),
        (64, "lognormal:1536,2048", 95.0, 98.0)) for r in point("llama3-8b", batch, 2000, gqa,
                                                                read)]}
    lines = tables().roofline_targets_table(small, mixed)
    assert lines[2:] == [
        "| 1 x 32k at 80% | llama3-8b (32:8) | 1 of 1: 80.0% | - | - |",
        "| 16 x 1k at 70% | llama3-8b (32:8) | 0 of 1 | 1: gqa 69.9%, read 79.0% | - |",
        "| mixed lengths at 85% | llama3-8b (32:8) | 1 of 3: 95.0% | 1: gqa 76.5%, read 90.0% | "
        "1: gqa 60.0%, read 77.0% |"]


def test_the_readmes_kvpr_against_hf_figures_are_the_recorded_data():
    """README: at every multi-head point of 1k tokens or more (row schedule, resident weights),
    HF's offloaded cache takes <lo-hi>x full transfer, and the fastest KVPR setting beats it by
    <lo-hi>x; recomputed here from kvpr_opt and kvpr_llama."""
    points = {}
    for name in ("kvpr_opt", "kvpr_llama"):
        for r in load_result("h200", name)["rows"]:
            if (r["schedule"], r["weights"]) == ("row", "resident") and r["context"] >= 1024 and (
                    r["model"] != "llama3-8b"):
                points.setdefault((r["model"], r["batch"], r["context"]), {}).setdefault(
                    r["setting"], r["step_ms"])
    hf_over_full, hf_over_kvpr = [], []
    for steps in points.values():
        if "hf-offloaded" in steps:
            hf_over_full.append(steps["hf-offloaded"] / steps["full-transfer"])
            kvpr = min(ms for setting, ms in steps.items() if setting.startswith("kvpr-"))
            hf_over_kvpr.append(steps["hf-offloaded"] / kvpr)
    assert len(hf_over_full) >= 10
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (f"takes {min(hf_over_full):.2f}-{max(hf_over_full):.2f}x full transfer there, so "
            f"KVPR beats it by {min(hf_over_kvpr):.2f}-{max(hf_over_kvpr):.2f}x") in readme
