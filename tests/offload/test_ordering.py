"""The runtime's streams are ordered by its events alone: run on the CPU with fake streams and
events that log every record and wait, each operation of a step (its stream span) must
happen-after what it reads, under CUDA's rules (in order within a stream; a wait covers the
event's last record before it). A missing or misplaced wait fails here, not as a rare GPU race."""

import contextlib
import dataclasses
from collections import deque

import pytest
import torch
from factories import make_cpu_stores, placed

from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.runtime import KVPRDecoder
from kvlab.offload.scheduler import token_chunks


class FakeStream:
    def __init__(self, name):
        self.name, self.ops = name, []  # ops: ("record", event) or ("wait", (stream, index))

    def wait_event(self, event):
        if event.last is not None:  # waiting on a never-recorded event waits for nothing
            self.ops.append(("wait", event.last))


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.last = None  # (stream, index) of the latest record

    def record(self, stream):
        stream.ops.append(("record", self))
        self.last = (stream, len(stream.ops) - 1)


class Graph:
    """Happens-before over (stream, index) nodes."""

    def __init__(self, streams):
        self.edges = {}
        for s in streams:
            for k, (kind, what) in enumerate(s.ops):
                if k:
                    self.edges.setdefault((s, k - 1), []).append((s, k))
                if kind == "wait":
                    self.edges.setdefault(what, []).append((s, k))

    def before(self, a, b) -> bool:
        seen, todo = {a}, deque([a])
        while todo:
            node = todo.popleft()
            if node == b:
                return True
            for nxt in self.edges.get(node, []):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False


def fake_cuda(monkeypatch, decoder):
    """Give `decoder` fake streams and events, as on a GPU, but keep its tensors on the CPU."""
    compute = FakeStream("compute")
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    decoder.copy_stream, decoder.store_stream = FakeStream("copy"), FakeStream("store")
    decoder._slot_free = [FakeEvent(), FakeEvent()]
    return [compute, decoder.copy_stream, decoder.store_stream]


def spans_of(recorded):
    """{(name, layer, batch): (start node, end node)} of a step's StreamSpans."""
    return {(name, layer, batch): (start.last, end.last)
            for _, name, layer, batch, start, end in recorded.marks}


def check_step(graph, spans, decoder, l, s):
    def before(a, b):
        assert graph.before(spans[a][1], spans[b][0]), f"{a} may not end before {b} starts"

    units = decoder.units()
    chunks = token_chunks(l, decoder.num_chunks)
    offloaded = decoder.weights == "offloaded"
    # a unit that starts a new layer loads its weights; `loader[n]`: the unit whose load unit n uses
    loads = [n for n in range(len(units)) if n == 0 or units[n - 1][0] != units[n][0]]
    loader = [max(k for k in loads if k <= n) for n in range(len(units))]
    for n, (i, g) in enumerate(units):
        w = units[loader[n]]
        for a, b in chunks:  # recompute reads its X chunk and W_K, W_V
            before((f"X[{a}:{b}]", i, g), (f"recompute [{a}:{b}]", i, g))
            if offloaded:
                before(("W_KV", *w), (f"recompute [{a}:{b}]", i, g))
        before((f"KV[{l}:{s}]", i, g), ("layer", i, g))
        if offloaded:
            before(("W_rest", *w), ("layer", i, g))
        before(("layer", i, g), ("new token", i, g))
        if n + 2 < len(units):  # unit n + 2 reuses unit n's buffer slot (X, K, V, new X)
            j, h = units[n + 2]
            writers = [f"X[{a}:{b}]" for a, b in chunks] + [f"KV[{l}:{s}]", "layer"]
            for name in writers + [f"recompute [{a}:{b}]" for a, b in chunks]:
                before(("new token", i, g), (name, j, h))
    if offloaded:  # load k + 2 overwrites the weight slot of load k: after all its users
        for k in range(len(loads) - 2):
            for n in range(len(units)):
                if loader[n] == loads[k]:
                    before(("layer", *units[n]), ("W_KV", *units[loads[k + 2]]))


@pytest.mark.parametrize("schedule", ["row", "column"])
@pytest.mark.parametrize("weights", ["resident", "offloaded"])
@pytest.mark.parametrize("gpu_batches", [1, 3])
def test_every_operation_waits_for_what_it_reads(monkeypatch, schedule, weights, gpu_batches):
    model = dataclasses.replace(MODELS["tiny-llama"], num_layers=5)  # weight slots get reused
    layers = random_layers(model, seed=3)
    stores = make_cpu_stores(model, layers, gpu_batches, 2, 24, 16)
    decoder = KVPRDecoder(model, placed(layers, weights), stores, "cpu", num_chunks=2,
                          record_spans=True, schedule=schedule)
    streams = fake_cuda(monkeypatch, decoder)
    hidden = torch.zeros(2 * gpu_batches, model.hidden_size)
    recorded = []
    for l in (5, 0, 18):  # the last recomputes last step's token from its X
        hidden = decoder.step(hidden, l)
        recorded.append((decoder.last_spans, l, stores[0].length - 1))
    graph = Graph(streams)
    for spans, l, s in recorded:
        check_step(graph, spans_of(spans), decoder, l, s)
    for (earlier, _, s), (later, l, s_next) in zip(recorded, recorded[1:], strict=False):
        old, new = spans_of(earlier), spans_of(later)
        reads = [f"X[{a}:{b}]" for a, b in token_chunks(l, decoder.num_chunks) if a <= s < b]
        reads += [f"KV[{l}:{s_next}]"] if l <= s else []
        assert len(reads) == 1
        for i, g in decoder.units():  # the copy of last step's token waits for its write-back
            assert graph.before(old[("new token", i, g)][1], new[(reads[0], i, g)][0])


def test_the_checker_catches_a_missing_wait(monkeypatch):
    """Drop the recompute's wait for its X chunk: the ordering check must fail."""
    model = MODELS["tiny-llama"]
    layers = random_layers(model, seed=3)
    stores = make_cpu_stores(model, layers, 1, 2, 24, 16)
    decoder = KVPRDecoder(model, layers, stores, "cpu", num_chunks=2, record_spans=True)
    streams = fake_cuda(monkeypatch, decoder)
    real_wait = KVPRDecoder._wait
    compute = streams[0]

    def skip_compute_waits_on_chunks(self, stream, event):
        if stream is compute and event is not None and event.last is not None and (
                event.last[0] is self.copy_stream and event not in self._slot_free):
            return  # NOTE: drops the recompute's and the layer's waits on the copy stream
        real_wait(self, stream, event)

    monkeypatch.setattr(KVPRDecoder, "_wait", skip_compute_waits_on_chunks)
    decoder.step(torch.zeros(2, model.hidden_size), 5)
    with pytest.raises(AssertionError, match="may not end before"):
        check_step(Graph(streams), spans_of(decoder.last_spans), decoder, 5, 16)
