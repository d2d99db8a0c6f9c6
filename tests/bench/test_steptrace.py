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
])
def test_bad_options_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "steptrace", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_without_a_gpu_it_says_so(monkeypatch, capsys):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(SystemExit):
        main(["bench", "steptrace", "--models", "tiny-llama", "--prompt", "16"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_tiny_models_steps_are_traced_kernel_by_kernel():
    args = parse(["bench", "steptrace", "--models", "tiny-llama", "--batches", "2",
                  "--prompt", "16", "--new-tokens", "12", "--steps", "4"])
    steptrace.check(args)
    result = steptrace.run(args)
    (row,) = result["rows"]
    assert len(row["steps"]) == 4 and row["num_kernels"] >= 8
    assert 0 < row["busy_us"] <= row["span_us"] and row["gap_us"] >= 0
    assert row["kernels"][0]["start_us"] == 0
    assert "tiny-llama" in steptrace.report(result)
