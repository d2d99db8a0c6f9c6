"""KVPR's runtime: decode steps with every layer's K, V (and optionally its weights) in host memory.

A step runs units (layer i, GPU batch g): row by row (every layer of one GPU batch, then the next
batch) or column by column (every GPU batch of one layer, then the next layer). Per unit, with s'
cached tokens and split l:
- copy stream: when the unit starts a new layer and the weights are offloaded, W_K and W_V; then
  X_i[0:l] in `num_chunks` token ranges, one event each; then the layer's other weights; then
  K_i, V_i[l:s'] (each a single contiguous block of the token-major host store);
- compute stream: each chunk's K, V recomputed as soon as its event fires, then, once the copy is
  in, the layer itself (attention over [0:s'] plus the new token, MLP), on a GPU as two CUDA
  graphs around the attention (`kvlab.offload.graphs`: the host enqueues a few calls per layer,
  not some 30 kernels);
- store stream: the new token's X, K and V back to the host.
Two GPU buffer slots alternate between units (and two weight slots between layers), so unit n + 1
crosses PCIe while unit n computes. The streams order each other through events only; nothing
synchronises the device. One event per buffer slot is enough: the copy into a slot waits for the
write-back of the slot's last unit, which the store stream runs after every earlier write-back,
after the compute stream's work on every earlier unit (so after the last use of a weight slot
too); tests/offload/test_ordering.py checks each operation against what it reads. On a CPU the
same code runs with no streams, one operation after another (what the exactness tests use).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from kvlab.checks import check_bool, check_positive_int
from kvlab.config import ModelConfig
from kvlab.model.layer import decode_layer
from kvlab.model.rope import RopeTable
from kvlab.model.weights import LayerWeights, check_layers, resolve_device
from kvlab.offload.graphs import StaticLayers
from kvlab.offload.host import HostStore
from kvlab.offload.overlap import StreamSpans
from kvlab.offload.recompute import recompute_kv
from kvlab.offload.scheduler import SCHEDULES, LayerShape, check_split, token_chunks, unit_shape
from kvlab.offload.weights import HostLayers


def _rope_table(model: ModelConfig, store: HostStore, device) -> RopeTable | None:
    if model.position != "rope":
        return None
    return RopeTable.build(model, store.max_context, store.dtype, device)


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


class _Loaded(NamedTuple):
    """What `_load` enqueued for one unit: its buffer slots and the copy stream's events."""

    slot: int  # K, V, X buffers
    weight_slot: int | None  # GPU weights (offloaded weights only)
    chunk_events: list  # X chunk k (and, before it, W_K, W_V) is in
    kv_event: object  # everything is in


class KVPRDecoder:
    """Decode steps over host stores: each layer's K, V for tokens [0:l] recomputed on the GPU
    from the transferred X[0:l], the rest copied, the two overlapped (see the module doc).

    model: the decoder's shapes. layers: every layer's weights, resident on `device` (a list of
    LayerWeights) or offloaded (`HostLayers`, copied in per layer, W_K and W_V first), of
    `model`'s shapes and the stores' dtype (`check_layers`: ValueError before any allocation).
    stores: one HostStore per GPU batch, all of one model, batch, max_context, dtype and length;
    a step's hidden rows are the GPU batches' rows in order.
    schedule: "row" (each GPU batch through every layer in turn: latency) or "column" (each
    layer over every GPU batch in turn, so offloaded weights cross the link once per layer per
    step, as in FlexGen: throughput). With resident weights the two do the same work.
    l = 0 is full transfer (FlexGen-style) and l = s' full recomputation, in the same runtime.
    num_chunks: X[0:l] crosses the link in this many chunks, each recomputed once it is in.
    Every chunk costs the host some 6 CUDA calls, and with the units double-buffered the
    pipeline's fill inside a unit hides behind its neighbours, so one chunk is the default (it
    was the faster on the H200: benchmarks/README.md).
    `record_spans=True` records CUDA events around every operation, per stream (`last_spans`,
    kvlab.offload.overlap).
    cuda_graphs: on a GPU, replay each layer's work around the attention as CUDA graphs (False:
    enqueue it eagerly, to measure what the graphs save).
    """

    def __init__(self, model: ModelConfig, layers: list[LayerWeights] | HostLayers,
                 stores: HostStore | list[HostStore], device, num_chunks: int = 1,
                 record_spans: bool = False, schedule: str = "row", cuda_graphs: bool = True):
        stores = [stores] if isinstance(stores, HostStore) else list(stores)
        check_positive_int("num_chunks", num_chunks)
        check_bool("record_spans", record_spans)
        check_bool("cuda_graphs", cuda_graphs)
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}: must be one of {SCHEDULES}")
        if not stores:
            raise ValueError("stores is empty: give one HostStore per GPU batch")
        first = stores[0]
        shape = (first.model, first.batch, first.max_context, first.dtype)
        for g, store in enumerate(stores):
            if (store.model, store.batch, store.max_context, store.dtype) != shape:
                raise ValueError(f"stores[{g}]: model, batch, max_context and dtype must equal "
                                 f"stores[0]'s ({model.name}, {first.batch}, "
                                 f"{first.max_context}, {first.dtype})")
        if first.model != model:
            raise ValueError(f"stores hold {first.model.name}'s layers, not {model.name}'s")
        self.model, self.stores, self.schedule = model, stores, schedule
        self.device, self.num_chunks = resolve_device(device), num_chunks
        self.record = record_spans
        self.cuda_graphs = cuda_graphs
        cuda = self.device.type == "cuda"
        offloaded = isinstance(layers, HostLayers)
        if cuda and not all(st.pinned for st in stores):
            raise ValueError("stores: GPU runs need pinned stores (pageable copies are "
                             "synchronous)")
        if cuda and offloaded and not layers.pinned:
            raise ValueError("layers: GPU runs need pinned HostLayers")
        if offloaded and layers.packing.dtype != first.dtype:
            raise ValueError(f"layers: offloaded as {layers.packing.dtype}, the stores hold "
                             f"{first.dtype}: they must match")
        if offloaded:  # every layer is packed as layer 0 (HostLayers checks): its host views
            check_layers(model, [layers.template] * len(layers), first.dtype, "cpu")
        else:
            check_layers(model, layers, first.dtype, self.device)
        self.layers, weights = layers, layers
        if offloaded:  # two GPU weight slots, and the layers run with their views
            packing = layers.packing
            self._w_buf = [torch.empty(packing.num_bytes, dtype=torch.uint8, device=self.device)
                           for _ in range(2)]
            weights = [packing.views(buf, layers.template) for buf in self._w_buf]
        kv = (first.max_context, first.batch, model.num_kv_heads, model.head_dim)
        self.k_buf = [torch.empty(kv, dtype=first.dtype, device=device) for _ in range(2)]
        self.v_buf = [torch.empty(kv, dtype=first.dtype, device=device) for _ in range(2)]
        self.x_buf = [torch.empty(*kv[:2], model.hidden_size, dtype=first.dtype, device=device)
                      for _ in range(2)]
        self.copy_stream = torch.cuda.Stream(self.device) if cuda else None
        self.store_stream = torch.cuda.Stream(self.device) if cuda else None
        self._slot_free = [torch.cuda.Event() for _ in range(2)] if cuda else [None, None]
        self._weight_loads = 0
        self.last_spans = StreamSpans()
        self.rope = _rope_table(model, first, self.device)
        hidden = torch.empty(len(stores), first.batch, model.hidden_size, dtype=first.dtype,
                             device=self.device)
        self._static = StaticLayers(model, weights, hidden, self.k_buf, self.v_buf, self.rope,
                                    cuda and cuda_graphs)

    @property
    def weights(self) -> str:
        """"resident" or "offloaded"."""
        return "offloaded" if isinstance(self.layers, HostLayers) else "resident"

    @property
    def batch(self) -> int:
        """Sequences per step: every GPU batch's."""
        return sum(store.batch for store in self.stores)

    def unit_shape(self, context: int) -> LayerShape:
        """One unit's work for the scheduler at `context` cached tokens: its GPU batch and, with
        offloaded weights, its share of the layer's weight bytes (a column shares one load among
        the GPU batches)."""
        return unit_shape(self.model, self.batch, context, self.schedule, len(self.stores),
                          self.weights, self.stores[0].k.element_size())

    def units(self) -> list[tuple[int, int]]:
        """(layer, GPU batch) in the order a step runs them."""
        layers, batches = range(self.model.num_layers), range(len(self.stores))
        if self.schedule == "row":
            return [(i, g) for g in batches for i in layers]
        return [(i, g) for i in layers for g in batches]

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

    def _copy_weights(self, i: int, part: slice, slot: int) -> None:
        self._w_buf[slot][part].copy_(self.layers.layer_bytes[i][part], non_blocking=True)

    def _load(self, n: int, unit: tuple[int, int], new_layer: bool, s: int, l: int, chunks,
              spans: StreamSpans) -> _Loaded:
        """Enqueue unit n's copies (layer i's weights first when it is a new layer); returns
        its slots and events."""
        (i, g), slot, copy = unit, n % 2, self.copy_stream
        store, offloaded = self.stores[g], self.weights == "offloaded"
        weight_slot = None
        with self._on(copy):
            self._wait(copy, self._slot_free[slot])  # every unit before last is home (module doc)
            if offloaded:
                weight_slot = (self._weight_loads - (not new_layer)) % 2
            if offloaded and new_layer:
                self._weight_loads += 1
                with spans.span(copy, "H2D", "W_KV", i, g):
                    self._copy_weights(i, slice(0, self.layers.packing.kv_bytes), weight_slot)
            events = []
            for a, b in chunks:
                with spans.span(copy, "H2D", f"X[{a}:{b}]", i, g):
                    self.x_buf[slot][a:b].copy_(store.x[i, a:b], non_blocking=True)
                events.append(self._event(copy))
            if offloaded and new_layer:
                with spans.span(copy, "H2D", "W_rest", i, g):
                    self._copy_weights(i, slice(self.layers.packing.kv_bytes, None), weight_slot)
            with spans.span(copy, "H2D", f"KV[{l}:{s}]", i, g):
                self.k_buf[slot][l:s].copy_(store.k[i, l:s], non_blocking=True)
                self.v_buf[slot][l:s].copy_(store.v[i, l:s], non_blocking=True)
            return _Loaded(slot, weight_slot, events, self._event(copy))

    def step(self, hidden: torch.Tensor, l: int) -> torch.Tensor:
        """One decode step: hidden [batch, hidden_size] (the GPU batches' rows in order) -> the
        last layer's output. Recomputes K, V of tokens [0:l] of every layer (0 <= l <= s', the
        cached length). ValueError, before anything is copied, for stores of unequal lengths or
        full, an l outside [0, s'], or a hidden that is not a tensor of that shape, the stores'
        dtype and the decoder's device."""
        model, stores = self.model, self.stores
        s = stores[0].length
        if any(store.length != s for store in stores):
            raise ValueError(f"stores: lengths {[st.length for st in stores]} must be equal")
        check_split(l, s)
        if s >= stores[0].max_context:
            raise ValueError(f"max_context={stores[0].max_context}: the store is full")
        expected = (self.batch, model.hidden_size)
        dtype = stores[0].dtype
        if not isinstance(hidden, torch.Tensor):
            raise ValueError(f"hidden: must be a torch.Tensor {expected}, got "
                             f"{type(hidden).__name__}")
        if (tuple(hidden.shape), hidden.dtype, hidden.device) != (expected, dtype, self.device):
            raise ValueError(f"hidden: shape {tuple(hidden.shape)}, {hidden.dtype} on "
                             f"{hidden.device}; must be {expected}, {dtype} on {self.device}")
        compute = torch.cuda.current_stream(self.device) if self.copy_stream else None
        spans = self.last_spans = StreamSpans()
        if self.record and compute is not None:
            spans.start(compute)
        chunks, units, static = token_chunks(l, self.num_chunks), self.units(), self._static
        static.hidden.copy_(hidden.reshape(static.hidden.shape))
        static.set_position(s)

        def load(n):
            if n == len(units):
                return None
            return self._load(n, units[n], n == 0 or units[n - 1][0] != units[n][0], s, l,
                              chunks, spans)

        pending = load(0)
        for n, (i, g) in enumerate(units):
            loaded, pending = pending, load(n + 1)
            w = i if loaded.weight_slot is None else loaded.weight_slot
            self._recompute(static.weights[w], loaded, chunks, i, g, compute, spans)
            self._wait(compute, loaded.kv_event)
            with spans.span(compute, "compute", "layer", i, g):
                x_new = static.run(w, g, loaded.slot)
            self._store_token(i, g, s, loaded.slot, x_new, self._event(compute), spans)
        for store in stores:
            store.length = s + 1
        return static.hidden.reshape(hidden.shape).clone()

    def _recompute(self, w: LayerWeights, loaded: _Loaded, chunks, i: int, g: int, compute,
                   spans: StreamSpans) -> None:
        """K, V of each chunk of [0:l] from its X, as soon as the chunk is in."""
        slot = loaded.slot
        for (a, b), event in zip(chunks, loaded.chunk_events, strict=True):
            self._wait(compute, event)
            with spans.span(compute, "compute", f"recompute [{a}:{b}]", i, g):
                recompute_kv(self.model, w.attn, self.x_buf[slot][a:b], self.k_buf[slot][a:b],
                             self.v_buf[slot][a:b], a, self.rope)

    def _store_token(self, i: int, g: int, s: int, slot: int, x_new, computed,
                     spans: StreamSpans) -> None:
        """The new token's X, K, V of layer i, GPU batch g (all in the slot's buffers) back to
        the host, on the store stream."""
        back, store = self.store_stream, self.stores[g]
        self._wait(back, computed)
        with self._on(back), spans.span(back, "D2H", "new token", i, g):
            store.x[i, s].copy_(x_new, non_blocking=True)
            store.k[i, s].copy_(self.k_buf[slot][s], non_blocking=True)
            store.v[i, s].copy_(self.v_buf[slot][s], non_blocking=True)
        if back is not None:
            self._slot_free[slot].record(back)  # the slot's last reader (compute) is before it
