"""Per-CTA timelines of one `gqa` decode launch (and its merge) and of a plain read of the same
bytes: on which SM each CTA ran, when it started, when it reached the points of its work named
below, and when it ended. What `python -m kvlab bench timeline` records, to show where a small
step spends the time that a read of its bytes does not.

The kernels are built a second time with KVLAB_TIMELINE defined (kvlab.kernels.loader.defined,
kernels/timeline.cuh): thread 0 of each CTA writes %globaltimer readings (ns, advancing in steps
of 32 ns on the H200) and its %smid into a global array of its module, a few stores a CTA. A
traced launch is prepared as a timed one is (L2 flushed by a read, the stream held while the host
enqueues: `kvlab.timing.Timer.prepare`), and its stamps are read back after it.

Stamps, in ns after the first CTA of the launch began (the merge's after the decode's first):
- decode: `entry`; `ready`, thread 0's first block ids and seq_len in registers (the block
  table read that a read of contiguous bytes does not have); `issued`, its first K/V copies
  issued; `landed`, warp 0's first tile in shared memory; `loop_done`, every warp out of the main
  loop; `end`, its output written. A CTA whose partition starts past its sequence's end stops
  after `ready` (the later stamps are then -1).
- merge (split launches only): `entry` (a programmatic dependent launch starts early);
  `released`, its griddepcontrol.wait returned (the decode grid done, its writes visible);
  `loaded`, thread 0's first partials in registers; `end`. A CTA whose sequence has one
  partition (the decode launch wrote its output) stops after `entry` (CTA (0, 0): `released`).
- read: `entry`, `end`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
import torch

from kvlab.kernels import gqa, loader
from kvlab.kernels import read as plain_read
from kvlab.kernels.decode import DecodePlan

DEFINE = "KVLAB_TIMELINE"
REGIONS, MAX_CTAS, SLOTS = 2, 1 << 15, 8  # kernels/timeline.cuh
SM_SLOT = 0
# kernel -> (its region in its module, its stamps in slot order from slot 1): the enumerators
# of kernels/timeline.cuh (tests/kernels/test_nvcc.py checks they agree)
KERNELS = {"decode": (0, ("entry", "ready", "issued", "landed", "loop_done", "end")),
           "merge": (1, ("entry", "released", "loaded", "end")),
           "read": (0, ("entry", "end"))}


@dataclass
class Launch:
    """One traced launch of one kernel, its CTAs in grid order: `sm` the SM each ran on, and
    `stamps[name]` the ns after `t0` at which each reached that point (-1: it did not)."""

    sm: np.ndarray
    stamps: dict[str, np.ndarray]
    t0: int  # the %globaltimer reading the stamps count from

    @classmethod
    def from_records(cls, kernel: str, records: np.ndarray, t0: int | None = None) -> Launch:
        """A launch from its records (uint64 [num_ctas, SLOTS], as the kernel wrote them; 0 where
        nothing was), its stamps counted from `t0` (default: the first CTA's entry)."""
        names = KERNELS[kernel][1]
        raw = records[:, 1:1 + len(names)].astype(np.int64)
        entries = raw[:, 0][raw[:, 0] > 0]
        if entries.size == 0:
            raise RuntimeError(f"the traced {kernel} launch wrote no stamps: was it built with "
                               f"{DEFINE}?")
        t0 = int(entries.min()) if t0 is None else int(t0)
        stamps = {n: np.where(raw[:, i] > 0, raw[:, i] - t0, -1) for i, n in enumerate(names)}
        return cls(records[:, SM_SLOT].astype(np.int64), stamps, t0)

    def to_dict(self) -> dict:
        return {"sm": self.sm.tolist(), **{n: v.tolist() for n, v in self.stamps.items()}}


def _us(ns) -> float:
    return round(float(ns) / 1000, 3)


def phases(decode: Launch, merge: Launch | None, read: Launch) -> dict[str, float]:
    """Where one traced step's time went, in us: the decode launch's span (first entry to last
    end) and, per CTA (medians), the time to its block ids, to its first copies issued, to its
    first tile, in its main loop and after it; when its CTAs ended; the merge's release, loads
    and end after the decode's last CTA; and the read's span and first end."""
    d = decode.stamps
    done = d["end"] >= 0
    s = {"decode_ctas": int(decode.sm.size), "decode_ctas_done": int(done.sum()),
         "decode_span_us": _us(d["end"][done].max()),
         "decode_last_entry_us": _us(d["entry"].max()),
         "ready_us": _us(np.median(d["ready"][done] - d["entry"][done])),
         "issued_us": _us(np.median(d["issued"][done] - d["entry"][done])),
         "landed_us": _us(np.median(d["landed"][done] - d["entry"][done])),
         "loop_us": _us(np.median(d["loop_done"][done] - d["landed"][done])),
         "epilogue_us": _us(np.median(d["end"][done] - d["loop_done"][done])),
         "decode_first_end_us": _us(d["end"][done].min())}
    # merge CTAs of sequences of one partition stop at once (the decode launch wrote them)
    merged = None if merge is None else merge.stamps["end"] >= 0
    if merged is not None and merged.any():
        m, last = {k: v[merged] for k, v in merge.stamps.items()}, d["end"][done].max()
        s.update({"merge_ctas": int(merge.sm.size), "merge_ctas_merging": int(merged.sum()),
                  "merge_first_entry_us": _us(merge.stamps["entry"].min()),
                  "merge_released_after_us": _us(m["released"].min() - last),
                  "merge_loads_us": _us(np.median(m["loaded"] - m["released"])),
                  "merge_rest_us": _us(np.median(m["end"] - m["loaded"])),
                  "merge_end_after_us": _us(m["end"].max() - last),
                  "step_span_us": _us(m["end"].max())})
    else:
        s["step_span_us"] = s["decode_span_us"]
    r = read.stamps
    s.update({"read_ctas": int(read.sm.size), "read_span_us": _us(r["end"].max()),
              "read_first_end_us": _us(r["end"].min())})
    return s


def median_phases(traces: list[dict[str, float]]) -> dict[str, float]:
    """The median of each phase over several traced steps (`phases` of each)."""
    return {k: round(statistics.median(t[k] for t in traces), 3) for k in traces[0]}


def _global(module):
    cupy = loader.import_cupy()
    return cupy.ndarray((REGIONS, MAX_CTAS, SLOTS), cupy.uint64,
                        module.get_global("kvlab_timeline"))


class Tracer:
    """Traces `gqa` on `cache`'s sequences `seq_ids` (the launch of DecodePlan(cache, seq_ids,
    num_qo_heads, "gqa")) and a plain read of `num_bytes` (kvlab.kernels.read.PlainRead), both
    built with the timeline stamps. Raises ValueError, before planning, for a num_bytes the read
    refuses, and before allocating the read, where a launch has more CTAs than a timeline holds
    (MAX_CTAS)."""

    def __init__(self, cache, seq_ids, num_qo_heads: int, num_bytes: int):
        plain_read.check_num_bytes(num_bytes)
        device = cache.device
        with loader.defined(DEFINE):
            self.plan = DecodePlan(cache, seq_ids, num_qo_heads, "gqa")
            launcher = self.plan.launcher
            self.counts = {"decode": int(np.prod(launcher.decode_grid)),
                           "merge": int(np.prod(launcher.merge_grid or (0,)))}
            for kernel, n in self.counts.items():
                if n > MAX_CTAS:
                    raise ValueError(f"the {kernel} launch has {n} CTAs: a timeline holds at "
                                     f"most {MAX_CTAS}")
            self.read = plain_read.PlainRead(num_bytes, device)
            self.counts["read"] = self.read.num_ctas
            decode_name, merge_name = launcher.names
            self._arrays = {
                "decode": _global(loader.module_of(gqa.SOURCE, decode_name, device.index)),
                "merge": _global(loader.module_of(gqa.SOURCE, merge_name, device.index)),
                "read": _global(loader.module_of(plain_read.SOURCE, "read_bytes",
                                                 device.index)),
            }
        self.device = device

    def _records(self, kernel: str) -> np.ndarray:
        region = KERNELS[kernel][0]
        return self._arrays[kernel][region, :self.counts[kernel]].get()

    def _zero(self, kernels) -> None:
        for kernel in kernels:
            self._arrays[kernel][KERNELS[kernel][0], :self.counts[kernel]].fill(0)
        torch.cuda.synchronize(self.device)  # the zeros land before the launch

    def trace_gqa(self, q, out, timer, spin: int) -> tuple[Launch, Launch | None]:
        """One gqa step on q, written to out, prepared as `timer` prepares a timed run: its
        decode launch and its merge launch (None where it has none)."""
        kernels = ["decode", "merge"] if self.counts["merge"] else ["decode"]
        self._zero(kernels)
        timer.prepare(spin)
        self.plan.run(q, out=out)
        torch.cuda.synchronize(self.device)
        decode = Launch.from_records("decode", self._records("decode"))
        merge = (Launch.from_records("merge", self._records("merge"), decode.t0)
                 if self.counts["merge"] else None)
        return decode, merge

    def trace_read(self, timer, spin: int) -> Launch:
        """One read, prepared as `timer` prepares a timed run."""
        self._zero(["read"])
        timer.prepare(spin)
        self.read.read()
        torch.cuda.synchronize(self.device)
        return Launch.from_records("read", self._records("read"))
