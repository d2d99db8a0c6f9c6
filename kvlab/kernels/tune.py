"""`kernel="auto"` on a GPU: time every prefetch setting on first use of a shape, keep the fastest.

The recorded H200 benchmark (`kvlab.kernels.select`) knows only the shapes and the GPU it was
recorded on, and the settings differ by a few percent near the bandwidth limit. So on the first
plan of a shape bucket, `DecodePlan` times each candidate on its own cache and block tables (L2
flushed before every run, candidates in turn, median of NUM_RUNS) and every later plan in that
bucket reuses the winner: on the H200 that was within 3% of the best setting at 312 of 315
benchmark points. A bucket is one GPU model, kernel family, dtype, head_dim, block size and
head counts, with the batch and the longest sequence rounded up to powers of two.

The recorded choice is used instead when KVLAB_AUTOTUNE=0, while a CUDA graph is being captured
(nothing may synchronise then), and when the GPU has no room for the timer's L2-flush buffer.
"""

import os
import warnings

import torch

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.timing import Timer

CANDIDATES = (
    PrefetchConfig(),
    *(PrefetchConfig(mode, distance=d) for mode in ("bulk", "line") for d in (1, 2, 4)),
)
NUM_RUNS = 10

_choices: dict[tuple, PrefetchConfig] = {}
measured: dict[tuple, dict[str, float]] = {}  # bucket -> {prefetch label: median ms}, to inspect


def enabled() -> bool:
    """Whether plans may time candidates now (KVLAB_AUTOTUNE, default 1, and no graph capture)."""
    value = os.environ.get("KVLAB_AUTOTUNE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"KVLAB_AUTOTUNE={value!r}: must be '0' or '1'")
    return value == "1" and not torch.cuda.is_current_stream_capturing()


def _pow2_ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def bucket(cache, kernel: str, num_qo_heads: int, num_seqs: int, max_seq_len: int) -> tuple:
    return (torch.cuda.get_device_name(cache.device), kernel, cache.dtype, cache.head_dim,
            cache.block_size, num_qo_heads, cache.num_kv_heads, _pow2_ceil(num_seqs),
            _pow2_ceil(max_seq_len))


def fastest(key: tuple, device, make_run, fallback) -> PrefetchConfig:
    """The candidate whose `make_run(candidate)()` is fastest, measured once per bucket `key`.
    `fallback()` gives the setting to use when the timer cannot be set up."""
    if key not in _choices:
        try:
            timer = Timer(device, num_runs=NUM_RUNS, num_warmup=2)
        except torch.OutOfMemoryError:
            warnings.warn("kernel='auto': no GPU memory for the timer's L2 flush; using the "
                          "recorded choice", stacklevel=3)
            return fallback()
        times = timer.medians_ms({p: make_run(p) for p in CANDIDATES})
        measured[key] = {p.label(): ms for p, ms in times.items()}
        _choices[key] = min(times, key=times.get)
    return _choices[key]
