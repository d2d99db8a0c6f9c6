"""`kernel="auto"` on a GPU: time every prefetch setting on first use of a shape, keep a winner.

The recorded H200 benchmark (`kvlab.kernels.select`) knows only the shapes and the GPU it was
recorded on, and the settings differ by a few percent near the bandwidth limit. So on the first
plan of a shape bucket, `DecodePlan` times each candidate on its own cache and block tables (L2
flushed before every run, candidates in turn, NUM_RUNS runs each) and every later plan in that
bucket reuses the choice. A bucket is one GPU model and SM count (`kvlab.kernels.green`), kernel
family, dtype, head_dim, block size and head counts, with the batch and the longest sequence
rounded up to powers of two.

A small decode call lasts tens of microseconds (docs/small-steps.md), and a few runs of it
pick noise. So a prefetch setting is chosen only when it wins by more than the run-to-run
spread: its upper quartile below the lower quartile of no prefetch. Of the settings that do,
the one with the lowest median; otherwise no prefetch.
`python -m kvlab bench attention --kernels ... auto` measures the choice at the point it was
tuned on, at a point of the same bucket where it is reused, and with KVLAB_AUTOTUNE=0.

The recorded choice is used instead when KVLAB_AUTOTUNE=0, while a CUDA graph is being captured
(nothing may synchronise then), and when the GPU has no room for the timer's L2-flush buffer.
"""

import os
import statistics
import warnings

import torch

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.timing import Timer, quartiles

NO_PREFETCH = PrefetchConfig()
CANDIDATES = (
    NO_PREFETCH,
    *(PrefetchConfig(mode, distance=d) for mode in ("bulk", "line") for d in (1, 2, 4)),
)
NUM_RUNS = 30

_choices: dict[tuple, PrefetchConfig] = {}
measured: dict[tuple, dict[str, float]] = {}  # bucket -> {prefetch label: median ms}, to inspect


def enabled() -> bool:
    """Whether plans may time candidates now (KVLAB_AUTOTUNE, default 1, and no graph capture)."""
    value = os.environ.get("KVLAB_AUTOTUNE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"KVLAB_AUTOTUNE={value!r}: must be '0' or '1'")
    return value == "1" and not torch.cuda.is_current_stream_capturing()


def clear() -> None:
    """Forget every choice made in this process: the next plan of each bucket tunes again."""
    _choices.clear()
    measured.clear()


def pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def bucket(cache, kernel: str, num_qo_heads: int, num_seqs: int, max_seq_len: int,
           num_sms: int) -> tuple:
    return (torch.cuda.get_device_name(cache.device), num_sms, kernel, cache.dtype,
            cache.head_dim, cache.block_size, num_qo_heads, cache.num_kv_heads,
            pow2_ceil(num_seqs), pow2_ceil(max_seq_len))


def choose(times: dict[PrefetchConfig, list[float]]) -> PrefetchConfig:
    """The setting `fastest` keeps, from every timed run of each candidate (NO_PREFETCH among
    them): of the settings whose upper quartile lies below no prefetch's lower quartile, the one
    with the lowest median; no prefetch when none does."""
    floor = quartiles(times[NO_PREFETCH])[0]
    winners = [p for p, runs in times.items() if p != NO_PREFETCH and quartiles(runs)[1] < floor]
    return min(winners, key=lambda p: statistics.median(times[p]), default=NO_PREFETCH)


def fastest(key: tuple, device, make_run, fallback) -> PrefetchConfig:
    """The candidate `choose` keeps when each `make_run(candidate)()` is timed, measured once per
    bucket `key`. `fallback()` gives the setting to use when the timer cannot be set up."""
    if key not in _choices:
        try:
            timer = Timer(device, num_runs=NUM_RUNS, num_warmup=2)
        except torch.OutOfMemoryError:
            warnings.warn("kernel='auto': no GPU memory for the timer's L2 flush; using the "
                          "recorded choice", stacklevel=3)
            return fallback()
        times = timer.times_ms({p: make_run(p) for p in CANDIDATES})
        measured[key] = {p.label(): statistics.median(runs) for p, runs in times.items()}
        _choices[key] = choose(times)
    return _choices[key]
