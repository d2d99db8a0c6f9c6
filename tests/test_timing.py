"""The benchmark timer measures GPU time, run by run in turn (GPU only)."""

import time

import pytest
import torch

from kvlab.timing import Timer

pytestmark = pytest.mark.gpu


def test_slow_host_calls_are_timed_by_their_gpu_work():
    # Without the spin before the start event, this would time the host's 0.3 ms sleep.
    tiny = torch.zeros(1, device="cuda")

    def slow_to_enqueue():
        time.sleep(3e-4)
        tiny.add_(1)

    assert Timer("cuda", num_runs=10).median_ms(slow_to_enqueue) < 0.05


def test_interleaved_medians_keep_each_callable_apart():
    timer = Timer("cuda", num_runs=10, flush_l2=False)
    times = timer.medians_ms({n: lambda n=n: torch.cuda._sleep(n * 200_000) for n in (1, 2, 4)})
    assert list(times) == [1, 2, 4]
    assert times[2] / times[1] == pytest.approx(2, rel=0.1)
    assert times[4] / times[1] == pytest.approx(4, rel=0.1)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="num_runs=0"):
        Timer("cuda", num_runs=0)
