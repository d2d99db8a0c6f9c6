"""KVPR's runtime: decode steps with every layer's K, V in host memory (row-by-row schedule, the
weights resident on the GPU).

Per layer i of a step over a batch with s' cached tokens and split l:
- copy stream: X_i[0:l] in `num_chunks` token ranges, one event each, then K_i, V_i[l:s'] (each a
  single contiguous block of the token-major host store);
- compute stream: each chunk's K, V recomputed as soon as its event fires, then, once the copy is
  in, the layer itself (attention over [0:s'] plus the new token, MLP);
- store stream: the new token's X, K and V back to the host.
Two GPU buffers alternate between layers, so layer i + 1 crosses PCIe while layer i computes. The
streams order each other through events only; nothing synchronises the device. On a CPU the same
code runs with no streams, one operation after another (what the exactness tests use).
"""

from __future__ import annotations

import contextlib

import torch

from kvlab.checks import check_positive_int
from kvlab.config import ModelConfig
from kvlab.offload.host import HostStore
from kvlab.offload.model import LayerWeights, decode_layer
from kvlab.offload.recompute import RopeTable, attention_input, project_kv, seeded_randn
from kvlab.offload.scheduler import check_split


def _device(device) -> torch.device:
    """`device` with its index: "cuda" means the current CUDA device."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _rope_table(model: ModelConfig, store: HostStore, device) -> RopeTable | None:
    if model.position != "rope":
        return None
    return RopeTable.build(model, store.max_context, store.dtype, device)


def fill(store: HostStore, layers: list[LayerWeights], context: int, seed: int = 0,
         device="cpu") -> None:
    """Prefill `store` with `context` tokens per sequence: for each layer, random layer inputs,
    their attention inputs X and the K, V computed from them at positions 0..context-1."""
    if not 0 <= context <= store.max_context:
        raise ValueError(f"context={context}: must be in [0, max_context={store.max_context}]")
    model, batch = store.model, store.batch
    positions = torch.arange(context, device=device).repeat_interleave(batch)
    for i, w in enumerate(layers):
        hidden = seeded_randn(seed + i, store.dtype, device)(context * batch, model.hidden_size)
        x = attention_input(model, w.attn, hidden)
        k, v = project_kv(model, w.attn, x, positions)
        store.x[i, :context].copy_(x.view(context, batch, -1))
        store.k[i, :context].copy_(k.view(context, batch, *k.shape[1:]))
        store.v[i, :context].copy_(v.view(context, batch, *v.shape[1:]))
    store.length = context


class ResidentDecoder:
    """The reference: every layer's K, V on the GPU, copied once from a filled store."""

    def __init__(self, model: ModelConfig, layers: list[LayerWeights], store: HostStore, device):
        self.model, self.layers = model, layers
        self.k = store.k[:, : store.max_context].to(device)
        self.v = store.v[:, : store.max_context].to(device)
        self.length, self.max_context = store.length, store.max_context
        self.rope = _rope_table(model, store, device)

    def step(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.length >= self.max_context:
            raise ValueError(f"max_context={self.max_context}: the cache is full")
        for i, w in enumerate(self.layers):
            hidden, _ = decode_layer(self.model, w, hidden, self.length, self.k[i], self.v[i],
                                     self.rope)
        self.length += 1
        return hidden


class Timeline:
    """CUDA events around each operation of a step, per stream (empty on a CPU)."""

    def __init__(self):
        self.marks: list[tuple[str, str, int, torch.cuda.Event, torch.cuda.Event]] = []
        self.origin: torch.cuda.Event | None = None

    @contextlib.contextmanager
    def span(self, stream, lane: str, name: str, layer: int):
        if stream is None:
            yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self.marks.append((lane, name, layer, start, end))

    def spans(self) -> list[dict]:
        """[{lane, name, layer, start_us, end_us}] from the step's start (synchronises)."""
        if self.origin is None:
            return []
        torch.cuda.synchronize()
        return [{"lane": lane, "name": name, "layer": layer,
                 "start_us": 1e3 * self.origin.elapsed_time(start),
                 "end_us": 1e3 * self.origin.elapsed_time(end)}
                for lane, name, layer, start, end in self.marks]


LANES = ("H2D", "compute", "D2H")  # the runtime's streams, in the order timelines show them


def chrome_trace(spans: list[dict], process: str = "kvlab KVPR decode step") -> dict:
    """Timeline spans as Chrome trace JSON (open it in Perfetto or chrome://tracing): one track
    per stream, one complete event ("X") per operation, times in microseconds."""
    lanes = list(dict.fromkeys([*LANES, *(s["lane"] for s in spans)]))
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": process}}]
    meta += [{"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": lane}}
             for i, lane in enumerate(lanes)]
    events = [{"ph": "X", "pid": 1, "tid": lanes.index(s["lane"]), "name": s["name"],
               "ts": s["start_us"], "dur": s["end_us"] - s["start_us"],
               "args": {"layer": s["layer"]}} for s in spans]
    return {"traceEvents": meta + events, "displayTimeUnit": "ns"}


def _chunks(l: int, num_chunks: int) -> list[tuple[int, int]]:
    """[0:l] as up to `num_chunks` non-empty token ranges of near-equal size."""
    bounds = [round(l * c / num_chunks) for c in range(num_chunks + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


class KVPRDecoder:
    """Decode steps over a HostStore: each layer's K, V for tokens [0:l] recomputed on the GPU
    from the transferred X[0:l], the rest copied, the two overlapped (see the module doc).

    l = 0 is full transfer (FlexGen-style) and l = s' full recomputation, in the same runtime.
    `timeline=True` records CUDA events around every operation (`last_timeline`).
    """

    def __init__(self, model: ModelConfig, layers: list[LayerWeights], store: HostStore, device,
                 num_chunks: int = 4, timeline: bool = False):
        if len(layers) != model.num_layers:
            raise ValueError(f"len(layers)={len(layers)}: must be {model.name}'s "
                             f"{model.num_layers}")
        check_positive_int("num_chunks", num_chunks)
        self.model, self.layers, self.store = model, layers, store
        self.device, self.num_chunks, self.record = _device(device), num_chunks, timeline
        cuda = self.device.type == "cuda"
        if cuda and not store.pinned:
            raise ValueError("store.pinned=False: GPU runs need a pinned store (pageable copies "
                             "are synchronous)")
        shape = (store.max_context, store.batch)
        kv = (*shape, model.num_kv_heads, model.head_dim)
        self.k_buf = [torch.empty(kv, dtype=store.dtype, device=device) for _ in range(2)]
        self.v_buf = [torch.empty(kv, dtype=store.dtype, device=device) for _ in range(2)]
        self.x_buf = [torch.empty(*shape, model.hidden_size, dtype=store.dtype, device=device)
                      for _ in range(2)]
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self.store_stream = torch.cuda.Stream(self.device) if cuda else None
        n = len(layers)
        self._slot_free = [torch.cuda.Event() for _ in range(2)] if cuda else None
        self._stored = [torch.cuda.Event() for _ in range(n)] if cuda else None
        self.last_timeline = Timeline()
        self.rope = _rope_table(model, store, self.device)
        # positions of the token-major rows [t0 * batch, t1 * batch) of a range [t0, t1)
        self._positions = torch.arange(store.max_context, device=self.device).repeat_interleave(
            store.batch
        )

    def _on(self, stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def _event(self, stream):
        if stream is None:
            return None
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _wait(self, stream, event) -> None:
        if stream is not None and event is not None:
            stream.wait_event(event)

    def _load(self, i: int, s: int, l: int, chunks, tl: Timeline):
        """Enqueue layer i's copies into buffer slot i % 2; returns (chunk events, KV event)."""
        slot, store, copy = i % 2, self.store, self.copy_stream
        with self._on(copy):
            if copy is not None:
                copy.wait_event(self._slot_free[slot])  # the layer before last is done with it
                copy.wait_event(self._stored[i])  # last step's new token of this layer is home
            events = []
            for a, b in chunks:
                with tl.span(copy, "H2D", f"X[{a}:{b}]", i):
                    self.x_buf[slot][a:b].copy_(store.x[i, a:b], non_blocking=True)
                events.append(self._event(copy))
            with tl.span(copy, "H2D", f"KV[{l}:{s}]", i):
                self.k_buf[slot][l:s].copy_(store.k[i, l:s], non_blocking=True)
                self.v_buf[slot][l:s].copy_(store.v[i, l:s], non_blocking=True)
            return events, self._event(copy)

    def step(self, hidden: torch.Tensor, l: int) -> torch.Tensor:
        """One decode step of the batch: hidden [batch, hidden_size] -> the last layer's output.
        Recomputes K, V of tokens [0:l] of every layer (0 <= l <= s', the cached length)."""
        store, model = self.store, self.model
        s = store.length
        check_split(l, s)
        if s >= store.max_context:
            raise ValueError(f"max_context={store.max_context}: the store is full")
        expected = (store.batch, model.hidden_size)
        if tuple(hidden.shape) != expected or hidden.device != self.device:
            raise ValueError(f"hidden: shape {tuple(hidden.shape)} on {hidden.device}; must be "
                             f"{expected} on {self.device}")
        compute = torch.cuda.current_stream(self.device) if self.copy_stream else None
        tl = self.last_timeline = Timeline()
        if self.record and compute is not None:
            tl.origin = torch.cuda.Event(enable_timing=True)
            tl.origin.record(compute)
        chunks = _chunks(l, self.num_chunks)
        pending = self._load(0, s, l, chunks, tl)
        batch = store.batch
        for i, w in enumerate(self.layers):
            slot = i % 2
            loaded, pending = pending, (
                self._load(i + 1, s, l, chunks, tl) if i + 1 < len(self.layers) else None
            )
            chunk_events, kv_event = loaded
            for (a, b), event in zip(chunks, chunk_events, strict=True):
                self._wait(compute, event)
                with tl.span(compute, "compute", f"recompute [{a}:{b}]", i):
                    positions = self._positions[a * batch:b * batch]
                    x = self.x_buf[slot][a:b].reshape(-1, model.hidden_size)
                    k, v = project_kv(model, w.attn, x, positions, self.rope)
                    self.k_buf[slot][a:b] = k.view(b - a, batch, *k.shape[1:])
                    self.v_buf[slot][a:b] = v.view(b - a, batch, *v.shape[1:])
            self._wait(compute, kv_event)
            with tl.span(compute, "compute", "layer", i):
                hidden, x_new = decode_layer(model, w, hidden, s, self.k_buf[slot],
                                             self.v_buf[slot], self.rope)
            self._store_token(i, s, slot, x_new, self._event(compute), tl)
        store.length = s + 1
        return hidden

    def _store_token(self, i: int, s: int, slot: int, x_new, computed, tl: Timeline) -> None:
        """The new token's X, K, V of layer i back to the host, on the store stream."""
        back, store = self.store_stream, self.store
        self._wait(back, computed)
        with self._on(back), tl.span(back, "D2H", "new token", i):
            if back is not None:
                x_new.record_stream(back)  # its memory must outlive the copy
            store.x[i, s].copy_(x_new, non_blocking=True)
            store.k[i, s].copy_(self.k_buf[slot][s], non_blocking=True)
            store.v[i, s].copy_(self.v_buf[slot][s], non_blocking=True)
        if back is not None:
            self._stored[i].record(back)
            self._slot_free[slot].record(back)  # the slot's last reader (compute) is before it
