"""The recorded decode launches the model is fitted on and answers with: every row of the H200's
attention recordings that ran a kernel family (`vllm_v1`, `gqa`, `gqa_fp8`: gqa on an fp8
cache) on blocks scattered through the pool, as a LaunchPoint with its time (`Recorded`).

FITTED: the recordings of the current kernels (2026-12-03), which the model is fitted and
tested on. OLDER: recordings of earlier kernels (block sizes 32 and 128; evict-last prefetch),
answered as measured where they are the point asked, but not fitted: the kernels changed since
(vllm_v1 at block 16 ran 0.66-1.35x as long then as now, gqa 1.04-1.43x).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.predict.point import LaunchPoint, launch_point
from kvlab.results import load_recorded

MACHINE = "h200"
FITTED = ("attention", "attention_sms", "attention_fp8", "attention_bf16", "attention_mixed",
          "attention_vllm", "attention_read", "attention_small", "attention_block_order")
OLDER = ("attention_block_sizes", "attention_evict_last")
# a row's kernel -> (family, the cache's dtype: None for the recording's own)
KERNELS = {"vllm_v1": ("vllm_v1", None), "gqa": ("gqa", None), "gqa_fp8": ("gqa", "fp8")}
ROWS = ("model", "batch", "context", "kernel", "prefetch", "ms", "gbps", "pct_roofline")


@dataclass(frozen=True, eq=False)
class Recorded:
    """One recorded launch: where it was recorded (`source`: the result's name, `date`), its
    row as recorded, and the LaunchPoint it ran."""

    source: str
    date: str
    row: dict
    point: LaunchPoint

    @property
    def ms(self) -> float:
        return self.row["ms"]

    @property
    def label(self) -> str:
        return f"recorded on NVIDIA H200, {self.date} ({self.source}.json)"


def _point(row: dict, dtype: str) -> LaunchPoint:
    family, kv_dtype = KERNELS[row["kernel"]]
    mixed = "lengths" in row
    return launch_point(row["model"], row["batch"], None if mixed else row["context"],
                        block_size=row["block_size"], family=family,
                        prefetch=PrefetchConfig.from_label(row["prefetch"]),
                        dtype=kv_dtype or dtype, lengths=row.get("lengths", "equal"),
                        num_sms=row.get("sms"), gpu_key=MACHINE)


@functools.cache
def recorded(names: tuple[str, ...] = FITTED) -> tuple[Recorded, ...]:
    """The recorded launches of the results `names` (of MACHINE), in their order; () where none
    is recorded (an installation without the results)."""
    found = []
    for name in names:
        result = load_recorded(MACHINE, [name], {"rows": ROWS})
        if result is None:
            continue
        dtype = result.get("dtype", "float16")
        date = result["source_dates"][name]
        for row in result["rows"]:
            if row["kernel"] in KERNELS and row.get("block_order", "scattered") == "scattered":
                found.append(Recorded(name, date, row, _point(row, dtype)))
    return tuple(found)


def key(point: LaunchPoint) -> tuple:
    """What makes two LaunchPoints the same recorded point."""
    shape = (point.num_qo_heads, point.num_kv_heads, point.head_dim)
    lengths = point.context if point.seq_lens is None else point.lengths
    return (point.family, shape, point.batch, lengths, point.block_size, point.dtype,
            point.num_sms, point.prefetch.label(), point.gpu.key)


@functools.cache
def _index() -> dict[tuple, Recorded]:
    index = {}
    for r in recorded(FITTED) + recorded(OLDER):  # the first recording of a point answers
        index.setdefault(key(r.point), r)
    return index


def measured(point: LaunchPoint) -> Recorded | None:
    """The recording of exactly `point` (the current kernels' first, then older ones), or None."""
    return _index().get(key(point))


def ranges(found: tuple[Recorded, ...]) -> dict:
    """{family: {dimension: [lowest, highest] or the values recorded}} over `found`: what a
    prediction inside is interpolated in."""
    out = {}
    for family in sorted({r.point.family for r in found}):
        points = [r.point for r in found if r.point.family == family]
        mixed = [p for p in points if p.seq_lens is not None]

        def span(values):
            values = list(values)
            return [min(values), max(values)] if values else []

        out[family] = {
            "batch": span(p.batch for p in points),
            "context": span(p.context for p in points if p.seq_lens is None),
            "mixed_max": span(p.context for p in mixed),
            "mixed_mean": span(round(float(p.seq_lens.mean())) for p in mixed),
            "group": span(p.group for p in points),
            "num_kv_heads": span(p.num_kv_heads for p in points),
            "num_sms": span(p.num_sms for p in points),
            **{name: sorted({getattr(p, name) for p in points})
               for name in ("head_dim", "block_size", "dtype")},
            "prefetch": sorted({p.prefetch.label() for p in points}),
        }
    return out
