"""Every figure in README.md, benchmarks/README.md and docs/ is the recorded data: generated
blocks hold exactly what `benchmarks/docgen.py` makes from the committed results now, and no
measured figure stands in the prose outside them (CPU)."""

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import docgen  # noqa: E402
from figures import blocks, small  # noqa: E402

HAS_GIT = shutil.which("git") is not None and subprocess.run(
    ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode == 0


def test_every_figure_in_the_docs_is_generated_or_a_fact():
    assert docgen.problems(check_git=HAS_GIT) == []


def test_each_block_sits_in_its_own_section_once():
    """A block is placed, not matched anywhere: each name appears once across the docs."""
    seen = {}
    for path in docgen.doc_files():
        for m in docgen.BLOCK.finditer(path.read_text()):
            seen.setdefault(m[2], []).append(path.relative_to(ROOT))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


@pytest.fixture
def page(tmp_path):
    """A docs page in a scratch root: (path, text) with one generated table and a sentence."""
    made = docgen.render(blocks()["fp8.table"]())
    text = (f"# fp8\n\nThe table:\n\n<!-- docgen: fp8.table -->{made}<!-- /docgen -->\n\n"
            "The paper claims 2.15x on an H20.\n")
    path = tmp_path / "page.md"
    path.write_text(text)
    return path, text


def test_the_checks_pass_on_a_page_of_generated_figures(page):
    path, _ = page
    assert docgen.problems([path], check_git=False) == []


def test_a_changed_digit_in_a_generated_table_is_caught(page):
    path, text = page
    first = next(line for line in text.splitlines() if line.startswith("| llama"))
    digit = next(c for c in first.split("|")[2] if c.isdigit())
    changed = first.replace(digit, str((int(digit) + 1) % 10), 1)
    path.write_text(text.replace(first, changed))
    assert docgen.problems([path], check_git=False) == [
        f"{path}: block 'fp8.table' is stale (python benchmarks/docgen.py)"]


@pytest.mark.parametrize("typed", ["reaches 1.93x over fp16", "at 72% of the roofline",
                                   "in 3.4 ms", "at 29 of 63 points", "about 4,281 GB/s"])
def test_a_figure_typed_into_prose_is_caught(page, typed):
    path, text = page
    path.write_text(text + f"\ngqa {typed}.\n")
    assert [p for p in docgen.problems([path], check_git=False)
            if "unchecked figure" in p] != []


def test_a_papers_claim_listed_as_a_fact_and_a_shape_pass(page):
    path, text = page
    path.write_text(text + "\nAt 16 x 1k and batch 64 the paper claims 2.15x.\n")
    assert docgen.problems([path], check_git=False) == []


def test_a_history_line_must_cite_a_revision(page):
    path, text = page
    path.write_text(text + "\n<!-- history -->\n- v3 (0123abc): 1.07x at 1 x 32k\n"
                    "- v4: 1.12x at 1 x 32k\n<!-- /history -->\n")
    assert docgen.problems([path], check_git=False) == [
        f"{path}: history line without a revision: '- v4: 1.12x at 1 x 32k'"]


@pytest.mark.skipif(not HAS_GIT, reason="needs the repository's git history")
def test_a_history_revision_must_be_a_commit(page):
    path, text = page
    path.write_text(text + "\n<!-- history -->\n- v3 (0123abc): 1.07x at 1 x 32k\n"
                    "<!-- /history -->\n")
    found = docgen.problems([path], check_git=True)  # this repository has no commit 0123abc
    assert len(found) == 1 and "without a revision" in found[0]


def test_roofline_targets_table_tells_a_miss_the_read_allows_from_one_it_does_not():
    def point(model, batch, context, gqa, read):
        return [{"model": model, "batch": batch, "context": context, "kernel": kernel,
                 "prefetch": "none", "pct_roofline": pct} for kernel, pct in (("gqa", gqa),
                                                                              ("read", read))]

    rows = {"rows": point("llama3-8b", 1, 32768, 80.0, 91.0) + point("llama3-8b", 16, 1024,
                                                                     69.9, 79.0)}
    mixed = {"rows": [dict(r, lengths=spec) for batch, spec, gqa, read in (
        (16, "lognormal:3200,16384", 76.5, 90.0), (16, "lognormal:1536,2048", 60.0, 77.0),
        (64, "lognormal:1536,2048", 95.0, 98.0)) for r in point("llama3-8b", batch, 2000, gqa,
                                                                read)]}
    lines = small.roofline_targets_table(rows, mixed)
    assert lines[2:] == [
        "| 1 x 32k at 80% | llama3-8b (32:8) | 1 of 1: 80.0% | - | - |",
        "| 16 x 1k at 70% | llama3-8b (32:8) | 0 of 1 | 1: gqa 69.9%, read 79.0% | - |",
        "| mixed lengths at 85% | llama3-8b (32:8) | 1 of 3: 95.0% | 1: gqa 76.5%, read 90.0% | "
        "1: gqa 60.0%, read 77.0% |"]


def test_docgen_check_exits_nonzero_on_a_problem(monkeypatch, page):
    path, text = page
    path.write_text(text.replace("2.15x", "2.16x"))
    monkeypatch.setattr(docgen, "doc_files", lambda: [path])
    assert docgen.main(["--check"]) == 1


def test_a_link_to_a_missing_page_or_heading_is_caught(page):
    path, text = page
    (path.parent / "other.md").write_text("# Other page\n\n## A heading, with commas\n")
    path.write_text(text + "\nSee [it](other.md#a-heading-with-commas), [gone](gone.md) and "
                    "[no such](other.md#nothing) but not `[code](x.md)`.\n")
    assert [p for p in docgen.problems([path], check_git=False) if "broken link" in p] == [
        f"{path}: broken link 'gone.md'", f"{path}: broken link 'other.md#nothing'"]


def _loop_rows(loop, ms_by_kernel):
    return [{"model": "llama3-8b", "batch": 16, "context": 1024 * (1 + loop), "loop": loop,
             "kernel": k,
             "ms": statistics.median(runs), "ms_runs": runs, "pct_roofline": 50.0}
            for k, runs in ms_by_kernel.items()]


def test_flashinfer_tally_counts_wins_ties_and_losses_and_names_the_losses():
    from figures import flashinfer

    result = {"rows": _loop_rows(0, {"gqa": [1.0, 1.0, 1.0], "flashinfer": [1.2, 1.2, 1.2]})
              + _loop_rows(1, {"gqa": [1.0, 1.1, 1.2], "flashinfer": [1.1, 1.1, 1.1]})
              + _loop_rows(2, {"gqa": [2.0, 2.0, 2.0], "flashinfer": [1.0, 1.0, 1.0]}),
              "skipped": []}
    assert flashinfer.tally_table(result)[2] == ("| `flashinfer` (CUDA-core decode) | `gqa` | 3 "
                                                 "| 1 | 1 | 1 | 0.500-1.200x |")
    assert flashinfer.outcomes(result, "loss") == "`flashinfer` at llama3-8b 16 x 3k (0.500x)"
    assert flashinfer.outcomes(result, "tie") == "`flashinfer` at llama3-8b 16 x 2k (1.000x)"


def test_flashinfer_e2e_table_sets_kvlab_waited_for_beside_hf_and_checks_hfs_compile():
    from figures import flashinfer

    rows = [{"model": "m", "batch": 64, "variant": v, "step_ms": ms, "tokens_per_s": 1.0,
             "ratio_to_roofline": 1.2, "compiled": compiled}
            for v, ms, compiled in (("gqa", 8.0, False), ("hf-static", 24.0, True),
                                    ("hf-static-eager", 40.0, False))]
    assert flashinfer.e2e_table({"rows": rows})[2].endswith(
        "| not recorded | 24.00 ms (1 tok/s) | 40.00 ms (1 tok/s) | 3.00x | - | 5.00x | 1.20x |")
    waited = {**rows[0], "variant": "gqa+sync", "step_ms": 9.6}  # kvlab on HF's basis
    assert flashinfer.e2e_table({"rows": [*rows, waited]})[2].endswith(
        "| 9.60 ms (1 tok/s) | 24.00 ms (1 tok/s) | 40.00 ms (1 tok/s) | 3.00x | 2.50x | 5.00x "
        "| 1.20x |")
    rows[1]["compiled"] = False
    with pytest.raises(ValueError, match="hf-static must be the compiled peer"):
        flashinfer.e2e_table({"rows": rows})


def test_the_checks_name_each_call_that_ran_on_a_recordings_code(monkeypatch):
    """gpu_checks (the recording's own call), then gpu_checks_added (the later calls), each
    with its revision and command; a recording with neither says so."""
    from figures import flashinfer

    later = {"revision": "b" * 40, "command": "bash benchmarks/device_run.sh"}
    results = {
        "own": {"git_revision": "a" * 40, "gpu_checks": {"tests": "3 passed"},
                "gpu_checks_added": [{**later, "memcheck": "ERROR SUMMARY: 0 errors"}]},
        "listed": {"git_revision": "a" * 40, "gpu_checks_added": [
            {**later, "tests": "5 passed"}, {**later, "command": "x", "tests": "2 passed"}]},
        "none": {"git_revision": "c" * 40}}
    monkeypatch.setattr(flashinfer, "load_result", lambda machine, name: results[name])
    for key, name in (("GRID", "own"), ("MIXED", "listed"), ("E2E", "none")):
        monkeypatch.setattr(flashinfer, key, ("h100", name))
    monkeypatch.setattr(flashinfer, "H200_FILES", ())
    assert flashinfer.checks() == [
        "- `h100/own`, at aaaaaaa, before the benchmark: tests 3 passed",
        "- `h100/own`, at bbbbbbb (`bash benchmarks/device_run.sh`): compute-sanitizer memcheck "
        "ERROR SUMMARY: 0 errors",
        "- `h100/listed`, at bbbbbbb (`bash benchmarks/device_run.sh`): tests 5 passed",
        "- `h100/listed`, at bbbbbbb (`x`): tests 2 passed",
        "- `h100/none` (at ccccccc): none recorded"]


def test_part_times_say_a_total_with_a_part_stopped_at_a_budget_is_a_lower_bound(monkeypatch):
    import rerecord
    from figures import manifest

    monkeypatch.setattr(rerecord, "parts", lambda machine: {"a": {}, "b": {}, "c": {}})
    timed = {"a": {"seconds": 10.0}, "b": {"seconds": 20.0}}
    monkeypatch.setattr(rerecord, "times", lambda machine: timed)
    assert manifest.part_times()[0] == "- `h100`: 2 of 3 parts timed, 30 s in all; not timed yet: c"
    timed["b"]["at_least"] = True
    assert manifest.part_times()[0] == ("- `h100`: 2 of 3 parts timed, at least 30 s in all (b: "
                                        "stopped at a budget, so a lower bound); not timed yet: "
                                        "c")


def test_a_dashboard_median_above_its_target_is_marked_missed():
    from figures import cpu

    def times(median):
        return {"min": median / 2, "median": median, "max": median * 2, "runs": [median] * 3}

    result = {"dashboard_python_s": times(1.0), "first_chart_s": times(8.0),
              "redraw_s": times(0.346), "redraw_all_s": times(0.5),
              "tab_first_view_s": {"KVPR": times(0.1)},
              "targets_s": {"dashboard_python_s": 2.0, "first_chart_s": 8.0, "redraw_s": 0.3}}
    rows = cpu.dashboard_table(result)[2:]
    assert [row.rsplit("|", 2)[1].strip() for row in rows] == ["2 s", "8 s", "0.3 s, missed", "-",
                                                                "-"]


def _traced_step(model: str, batch: int, names: list[str]) -> dict:
    return {"model": model, "batch": batch, "prompt": 512, "new_tokens": 32, "steps": [0] * 8,
            "kernels": [{"name": n, "start_us": 0.0, "dur_us": 1.0} for n in names]}


def test_linear_times_give_a_traces_gemms_to_the_step_linears_and_a_reduce_to_its_gemm():
    from figures import e2e

    from kvlab.bench.steptrace import mean_context
    from kvlab.config import MODELS
    from kvlab.predict.step import step_kernels

    layers = MODELS["llama3-8b"].num_layers
    layer = ["rms_norm", "nvjet_qkv", "rope_write", "gqa_decode", "nvjet_o", "splitKreduce_kernel",
             "rms_norm", "nvjet_gate_up", "silu_mul", "nvjet_down", "splitKreduce_kernel"]
    row = _traced_step("llama3-8b", 16, layer * layers + ["rms_norm", "nvjet_lm"])
    times = e2e.linear_times(row, folded=False)
    assert {k: us for k, (us, _) in times.items()} == {
        "qkv": layers, "w_o": 2 * layers, "gate + up": layers, "down": 2 * layers, "lm head": 1}
    modelled = dict(step_kernels("llama3-8b", 16, mean_context(512, 32, 8), folded=False))
    assert times["qkv"][1] == pytest.approx(layers * modelled["qkv"])
    assert times["lm head"][1] == pytest.approx(modelled["lm head"])
    with pytest.raises(ValueError, match="128 GEMM kernels traced, the step has 129"):
        e2e.linear_times(_traced_step("llama3-8b", 16, layer * layers), folded=False)
    with pytest.raises(ValueError, match="a split-K reduce traced before any GEMM"):
        e2e.linear_times(_traced_step("llama3-8b", 16, ["splitKreduce_kernel", *layer[1:]]
                                      * layers + ["nvjet_lm"]), folded=False)
