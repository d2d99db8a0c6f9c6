"""The overlap of a KVPR decode step: CUDA events around every operation, per stream
(`StreamSpans`), the overlap of link and GPU they show (`overlap`), and their export as
Chrome-trace JSON (Perfetto, chrome://tracing). ("Timeline" in kvlab is the per-CTA one of
kvlab.kernels.timeline; a KVPR result keeps these spans under its recorded key "timelines".)"""

from __future__ import annotations

import contextlib

import torch

LANES = ("H2D", "compute", "D2H")  # the runtime's streams, in the order figures show them


class StreamSpans:
    """CUDA events around each operation of a step, per stream (empty on a CPU)."""

    def __init__(self):
        self.marks: list[tuple[str, str, int, int, torch.cuda.Event, torch.cuda.Event]] = []
        self.origin: torch.cuda.Event | None = None

    def start(self, stream) -> None:
        """Mark the step's start on `stream` (times are taken from it)."""
        self.origin = torch.cuda.Event(enable_timing=True)
        self.origin.record(stream)

    @contextlib.contextmanager
    def span(self, stream, lane: str, name: str, layer: int, batch: int = 0):
        """Time what the block enqueues on `stream` (nothing when recording is off or on a
        CPU); `batch` is the GPU batch (column-by-column schedules run several per layer)."""
        if stream is None or self.origin is None:
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self.marks.append((lane, name, layer, batch, start, end))

    def spans(self) -> list[dict]:
        """[{lane, name, layer, batch, start_us, end_us}] from the step's start (synchronises).
        Times are rounded to 0.1 us (CUDA events resolve about 0.5 us)."""
        if self.origin is None:
            return []
        torch.cuda.synchronize()
        return [{"lane": lane, "name": name, "layer": layer, "batch": batch,
                 "start_us": round(1e3 * self.origin.elapsed_time(start), 1),
                 "end_us": round(1e3 * self.origin.elapsed_time(end), 1)}
                for lane, name, layer, batch, start, end in self.marks]


def chrome_trace(spans: list[dict], process: str = "kvlab KVPR decode step") -> dict:
    """Stream spans as Chrome trace JSON (open it in Perfetto or chrome://tracing): one track
    per stream, one complete event ("X") per operation, times in microseconds."""
    lanes = list(dict.fromkeys([*LANES, *(s["lane"] for s in spans)]))
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": process}}]
    meta += [{"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": lane}}
             for i, lane in enumerate(lanes)]
    events = [{"ph": "X", "pid": 1, "tid": lanes.index(s["lane"]), "name": s["name"],
               "ts": s["start_us"], "dur": s["end_us"] - s["start_us"],
               "args": {"layer": s["layer"], "batch": s.get("batch", 0)}} for s in spans]
    return {"traceEvents": meta + events, "displayTimeUnit": "ns"}


def overlap(spans: list[dict]) -> dict:
    """Busy time of the link (H2D) and of the GPU (compute) over one step, and the overlap: the
    step time that running them side by side saved, link + compute - step, as a share of the
    shorter one (clipped to [0, 1]): 1 = the step lasted as long as the longer activity, 0 = as
    long as both one after the other. Gaps where neither is busy (a host-bound step, the final
    write-back) lower it: it measures the step, not only the two streams. ValueError for no
    spans (a step run on a CPU, or without recording its spans, records none)."""
    if not spans:
        raise ValueError("spans=[]: no operations to measure (a step records them on a GPU "
                         "only, with record_spans=True)")
    step = max(s["end_us"] for s in spans) - min(s["start_us"] for s in spans)
    busy = {lane: sum(s["end_us"] - s["start_us"] for s in spans if s["lane"] == lane)
            for lane in ("H2D", "compute")}
    shorter = min(busy.values())
    hidden = busy["H2D"] + busy["compute"] - step
    share = min(max(hidden / shorter, 0.0), 1.0) if shorter > 0 else 1.0
    return {"link_busy_ms": busy["H2D"] / 1e3, "compute_busy_ms": busy["compute"] / 1e3,
            "overlap": round(share, 3)}
