"""GPU timing for benchmarks: CUDA events, warm-up, L2 flushed before every timed run, medians,
and the HBM roofline measured in the same process."""

import statistics

import torch

FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MiB L2


class Timer:
    """Times callables on one GPU. `flush_l2=False` measures a warm cache on purpose."""

    def __init__(self, device, num_runs: int = 25, num_warmup: int = 3, flush_l2: bool = True):
        if num_runs < 1 or num_warmup < 0:
            raise ValueError(f"num_runs={num_runs}, num_warmup={num_warmup}: need >= 1 and >= 0")
        self.device, self.num_runs, self.num_warmup = torch.device(device), num_runs, num_warmup
        self._scratch = (
            torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device) if flush_l2 else None
        )

    def times_ms(self, fn) -> list[float]:
        """`num_runs` timings of `fn()` in ms, after `num_warmup` untimed calls."""
        for _ in range(self.num_warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.num_runs)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.num_runs)]
        for start, end in zip(starts, ends, strict=True):
            if self._scratch is not None:
                self._scratch.zero_()  # evicts whatever the last run left in L2
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    def median_ms(self, fn) -> float:
        return statistics.median(self.times_ms(fn))


def copy_roofline_gbps(timer: Timer, num_bytes: int = 4 * 2**30) -> float:
    """HBM bandwidth of a large device-to-device copy, counting bytes read plus bytes written."""
    src = torch.empty(num_bytes // 2, dtype=torch.uint8, device=timer.device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    return num_bytes / (ms * 1e-3) / 1e9
