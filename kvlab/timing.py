"""GPU timing for benchmarks: CUDA events, warm-up, L2 flushed before every timed run, medians,
and the HBM roofline measured in the same process.

Two things keep short calls (10-50 us) honest:
- The L2 is flushed by READING a buffer 4x its size. A write flush (`zero_()`) leaves up to
  60 MiB of dirty lines that the timed kernel then pays to write back.
- Between the flush and the start event the stream spins (`torch.cuda._sleep`) for longer than
  the host takes to enqueue the timed call, so the events time the GPU's work, not Python's
  launch overhead.
Both were seen on the H200 when this timer was written (observations, not recorded results): a
write flush added 6.6-8.1 us to batch-1 decode calls of 31-45 us, and a one-element add timed
with nothing queued before it read 19 us instead of 4.
"""

import statistics
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from kvlab.checks import check_bool, check_int, check_positive_int

FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MiB L2
MAX_CLOCK_HZ = 2.0e9  # above any current GPU's SM clock, so a spin of N cycles lasts >= N / this
MIN_SPIN_S = 50e-6
METHOD = ("CUDA events; median of the timed runs after warm-up; L2 flushed by reading 256 MiB "
          "before each run; a GPU spin covers host enqueue; variants timed in turn")
K = TypeVar("K")


class Timer:
    """Times callables on one GPU. `flush_l2=False` measures a warm cache on purpose. ValueError
    unless num_runs is an integer >= 1, num_warmup one >= 0 and flush_l2 a bool."""

    def __init__(self, device, num_runs: int = 25, num_warmup: int = 3, flush_l2: bool = True):
        check_positive_int("num_runs", num_runs)
        check_int("num_warmup", num_warmup, 0)
        check_bool("flush_l2", flush_l2)
        self.device = torch.device(device)
        self.num_runs, self.num_warmup = int(num_runs), int(num_warmup)
        self._scratch = (
            torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device=device) if flush_l2 else None
        )

    def spin_cycles(self, fn) -> int:
        """GPU cycles to spin before each timed call: 4x the host time of one call of `fn` (the
        fastest of the warm-up calls, at least two: the first may set up libraries), and at
        least MIN_SPIN_S."""
        host_s = []
        for _ in range(max(self.num_warmup, 2)):
            t0 = time.perf_counter()
            fn()
            host_s.append(time.perf_counter() - t0)
        torch.cuda.synchronize(self.device)
        return int(MAX_CLOCK_HZ * max(4 * min(host_s), MIN_SPIN_S))

    def times_ms(self, fns: Mapping[K, Callable[[], object]]) -> dict[K, list[float]]:
        """Every timed run of each callable, in ms: `num_runs` runs after `num_warmup` untimed
        calls (at least two). The callables are timed in turn, run 1 of each, then run 2 of
        each, ..., so that slow drifts (clocks, temperature) fall on all of them alike (two
        timings of one kernel taken one after the other were seen 9% apart on the H200)."""
        spin = max(self.spin_cycles(fn) for fn in fns.values())
        events = {
            key: [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.num_runs)]
            for key in fns
        }
        for run in range(self.num_runs):
            for key, fn in fns.items():
                start, end = events[key][run]
                self.prepare(spin)
                start.record()
                fn()
                end.record()
        torch.cuda.synchronize(self.device)
        return {key: [start.elapsed_time(end) for start, end in runs]
                for key, runs in events.items()}

    def prepare(self, spin: int) -> None:
        """What precedes every timed run, on the current stream: the L2 flushed by a read
        (unless this timer measures a warm cache), then the stream held for `spin` GPU cycles
        (`spin_cycles`) while the host enqueues the run."""
        if self._scratch is not None:
            self._scratch.sum()  # reads evict whatever the last run left in L2
        torch.cuda._sleep(spin)

    def medians_ms(self, fns: Mapping[K, Callable[[], object]]) -> dict[K, float]:
        """The median of `times_ms` for each callable."""
        return {key: statistics.median(times) for key, times in self.times_ms(fns).items()}

    def median_ms(self, fn: Callable[[], object]) -> float:
        return self.medians_ms({None: fn})[None]


def quartiles(times: list[float]) -> tuple[float, float]:
    """The lower and upper quartile of `times` (two or more): the run-to-run spread."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return q1, q3


def back_to_back_ms(fn: Callable[[], object], device, num_calls: int = 10,
                    num_warmup: int = 3) -> float:
    """Milliseconds per call of `num_calls` calls enqueued back to back, between two CUDA events,
    with no flush and no spin: the rate that a pipeline enqueueing such calls one after another
    sustains, the slower of the GPU's work and the host's enqueueing (the Timer times the GPU's
    work alone). ValueError, before any call, unless num_calls is an integer >= 1 and
    num_warmup one >= 0."""
    check_positive_int("num_calls", num_calls)
    check_int("num_warmup", num_warmup, 0)
    for _ in range(num_warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(num_calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / num_calls


def copy_roofline_gbps(timer: Timer, num_bytes: int = 4 * 2**30) -> float:
    """HBM bandwidth of a large device-to-device copy, counting bytes read plus bytes written
    (`num_bytes`, an integer >= 2: half of it copied)."""
    check_int("num_bytes", num_bytes, 2)
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device=timer.device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    return num_bytes / (ms * 1e-3) / 1e9
