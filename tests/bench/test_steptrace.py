"""`bench steptrace`: a decode step's kernels split out of a profile by their graph launch, its
gaps and busy time; the options refused on the CPU; one tiny traced step on a GPU."""

import pytest

from kvlab.bench import steptrace
from kvlab.bench.cli import main, parse


def kernel(correlation, start, dur, name="k"):
    return {"name": name, "kind": "kernel", "correlation": correlation, "start_us": start,
            "dur_us": dur}


def launch(correlation, start):
    return {"name": steptrace.GRAPH_LAUNCH, "kind": "runtime", "correlation": correlation,
            "start_us": start, "dur_us": 1.0}


def test_kernels_are_split_by_the_graph_launch_that_ran_them():
    events = [launch(7, 100.0), kernel(7, 130.0, 5.0, "b"), kernel(7, 110.0, 10.0, "a"),
              launch(3, 50.0), kernel(3, 60.0, 4.0), kernel(99, 1.0, 2.0, "prefill"),
              {"name": "cudaLaunchKernel", "kind": "runtime", "correlation": 99,
               "start_us": 0.0, "dur_us": 1.0}]
    steps = steptrace.split_steps(events)
    assert [[k["start_us"] for k in s] for s in steps] == [[60.0], [110.0, 130.0]]  # by launch
    assert [k["name"] for k in steps[1]] == ["a", "b"]


def test_a_step_summary_counts_the_gaps_between_kernels_once():
    kernels = [kernel(1, 0.0, 10.0), kernel(1, 12.0, 3.0), kernel(1, 14.0, 6.0),  # overlaps
               kernel(1, 25.0, 5.0)]
    assert steptrace.step_summary(kernels) == {"num_kernels": 4, "span_us": 30.0,
                                               "busy_us": 24.0, "gap_us": 7.0}
    with pytest.raises(ValueError, match=r"kernels=\[\]: a step needs at least one kernel"):
        steptrace.step_summary([])
    with pytest.raises(ValueError, match=r"events\[0\]=.*: must be a dict with name, kind"):
        steptrace.split_steps([{"name": "k"}])


@pytest.mark.parametrize("argv, message", [
    (["--models", "opt-6.7b"], "--models opt-6.7b: the step model"),
    (["--steps", "40", "--new-tokens", "32"], "--steps 40: must be fewer than --new-tokens 32"),
    (["--prompt", "8000", "--models", "llama2-7b"], "beyond llama2-7b's context limit"),
    (["--ahead-bytes", "1e6"], "argument --ahead-bytes: '1e6': must be an integer in [0, "),
    (["--ahead-kv-bytes", "0", "-1"],
     "argument --ahead-kv-bytes: '-1': must be an integer in [0, "),
])
def test_bad_options_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "steptrace", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_counters_pair_each_gemm_with_the_prefetch_the_model_gives_it():
    """tiny-llama (2 layers) at batch 1: its 9 GEMMs in ncu's order paired with the step
    model's; the layers' medians per GEMM; a count that differs is said, not paired."""
    from kvlab.config import MODELS
    from kvlab.predict.step import ahead_hits

    layers = MODELS["tiny-llama"].num_layers
    modelled = ahead_hits("tiny-llama", 1, 18, 4096)
    gemms = [{"kernel_name": f"linear {i}", "is_gemm": True, "load_hit_share": 0.1 * (i % 4)}
             for i in range(len(modelled))]
    rows = [{"kernel_name": "norm", "is_gemm": False, "load_hit_share": 1.0}, *gemms]
    found = steptrace.step_counters("tiny-llama", 1, 18, 4096, rows)
    assert found["kernels"] == rows and found["note"] is None
    assert found["attention"] == {"load_hit_share": None, "prefetched_share": 0.0}
    assert [g["name"] for g in found["gemms"]] == ["qkv", "w_o", "gate + up", "down", "lm head"]
    assert [g["load_hit_share"] for g in found["gemms"]][:4] == pytest.approx(
        [0.0, 0.1, 0.2, 0.3])
    assert all(g["prefetched_share"] == pytest.approx(min(4096, w) / w)
               for g, (_, w, _) in zip(found["gemms"], modelled[:4] + modelled[-1:],
                                       strict=True))
    assert len(modelled) == 4 * layers + 1
    short = steptrace.step_counters("tiny-llama", 1, 18, 4096, rows[:-1])
    assert short["gemms"] is None
    assert short["note"] == f"ncu gave {len(modelled) - 1} GEMM kernels, the step model " \
                            f"{len(modelled)}: not paired"
    report = steptrace.report({"gpu": "G", "roofline_copy_gbps": 1.0, "rows": [
        {"model": "tiny-llama", "batch": 1, "ahead_bytes": 4096, "num_kernels": 12,
         "span_us": 1.0, "busy_us": 1.0, "gap_us": 0.0, "roofline_us": 1.0,
         "modelled_idle_us": 1.0, "counters": found}]})
    assert "GEMM loads hitting L2, ncu (the prefetch's share, modelled): qkv 0% (" in report


def test_counters_give_the_attentions_hits_beside_the_kv_share_prefetched():
    """The attention kernels' median share of loads hitting L2 (their merge left out), beside
    ahead_kv_bytes over a layer's K and V at the context (capped at all of it)."""
    from kvlab.config import MODELS

    m = MODELS["tiny-llama"]
    layer_kv = 2 * m.num_kv_heads * m.head_dim * 2 * 3 * 18  # K and V, fp16, 3 x 18 tokens
    attention = [{"kernel_name": f"void gqa_decode<{i}>(...)", "is_gemm": False,
                  "load_hit_share": share} for i, share in enumerate((0.2, None, 0.6, 0.5))]
    rows = [*attention, {"kernel_name": "gqa_merge", "is_gemm": False, "load_hit_share": 0.9}]
    found = steptrace.step_counters("tiny-llama", 3, 18, 0, rows, ahead_kv_bytes=layer_kv // 4)
    assert found["attention"] == {"load_hit_share": 0.5, "prefetched_share": 0.25}
    assert steptrace.step_counters("tiny-llama", 3, 18, 0, rows, 4 * layer_kv)["attention"][
        "prefetched_share"] == 1.0
    report = steptrace.report({"gpu": "G", "roofline_copy_gbps": 1.0, "rows": [
        {"model": "tiny-llama", "batch": 3, "ahead_bytes": 0, "ahead_kv_bytes": layer_kv // 4,
         "num_kernels": 5, "span_us": 1.0, "busy_us": 1.0, "gap_us": 0.0, "roofline_us": 1.0,
         "modelled_idle_us": 1.0, "counters": found}], "skipped": [
        {"model": "tiny-llama", "batch": 16, "ahead_bytes": 0, "ahead_kv_bytes": 4096,
         "reason": "at most 2 rows"}]})
    assert (f"tiny-llama batch=3 ahead_bytes=0 ahead_kv_bytes={layer_kv // 4:,}: attention "
            "loads hitting L2, ncu 50% (the K/V prefetch's share 25%)") in report
    assert report.endswith(
        "tiny-llama batch=16 ahead_bytes=0 ahead_kv_bytes=4,096 skipped: at most 2 rows")


def test_counters_without_ncu_are_refused_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setattr(steptrace.shutil, "which", lambda name: None)
    with pytest.raises(SystemExit):
        main(["bench", "steptrace", "--counters", "--models", "tiny-llama", "--prompt", "16"])
    assert "--counters needs Nsight Compute: ncu not found on PATH" in capsys.readouterr().err


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(SystemExit):
        main(["bench", "steptrace", "--models", "tiny-llama", "--prompt", "16"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_engine_prefills_every_prompt_at_once_and_graphs_serve_every_step():
    options = steptrace.engine_options(16, 4064, 32)
    assert options == {"num_blocks": 16 * 256 + 16, "max_prefill_tokens": 16 * 4064,
                       "graph_max_len": None}  # the engine's own graphs, as bench e2e runs
    assert steptrace.engine_options(1, 32736, 32)["graph_max_len"] == 32768


@pytest.mark.gpu
def test_a_tiny_models_steps_are_traced_kernel_by_kernel():
    args = parse(["bench", "steptrace", "--models", "tiny-llama", "--batches", "2",
                  "--prompt", "16", "--new-tokens", "12", "--steps", "4",
                  "--ahead-bytes", "0", "65536"])
    steptrace.check(args)
    result = steptrace.run(args)
    without, ahead = result["rows"]
    assert (without["ahead_bytes"], ahead["ahead_bytes"]) == (0, 65536)
    for row in (without, ahead):
        assert len(row["steps"]) == 4 and row["num_kernels"] >= 8
        assert 0 < row["busy_us"] <= row["span_us"] and row["gap_us"] >= 0
        assert row["kernels"][0]["start_us"] == 0
    assert ahead["num_kernels"] == without["num_kernels"]  # the prefetch launches nothing
    assert ahead["modelled_idle_us"] < without["modelled_idle_us"]
    assert "tiny-llama" in steptrace.report(result)


@pytest.mark.gpu
def test_the_kv_prefetch_is_traced_where_the_qkv_linear_serves_it():
    """--ahead-kv-bytes traces a batch of layer_ops' LINEAR_ROWS with and without it; one row
    more only without, the other named in `skipped`."""
    from kvlab.kernels.layer_ops import LINEAR_ROWS

    most, above = LINEAR_ROWS, LINEAR_ROWS + 1
    args = parse(["bench", "steptrace", "--models", "tiny-llama", "--batches", str(most),
                  str(above), "--prompt", "16", "--new-tokens", "12", "--steps", "4",
                  "--ahead-kv-bytes", "0", "8192"])
    steptrace.check(args)
    result = steptrace.run(args)
    assert [(r["batch"], r["ahead_kv_bytes"]) for r in result["rows"]] == [
        (most, 0), (most, 8192), (above, 0)]
    assert [(s["batch"], s["ahead_kv_bytes"]) for s in result["skipped"]] == [(above, 8192)]
    assert result["rows"][1]["num_kernels"] == result["rows"][0]["num_kernels"]
