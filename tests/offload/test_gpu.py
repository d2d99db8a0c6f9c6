"""The KVPR runtime on a GPU: pinned exact-size memory, streams ordered by events, and the same
outputs as the resident cache (GPU only)."""

import dataclasses

import pytest
import torch

from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.host import HostStore, PinnedHostMemory, fill
from kvlab.offload.profiler import host_seconds, link_bytes_per_s, profile
from kvlab.offload.runtime import KVPRDecoder, ResidentDecoder
from kvlab.offload.weights import HostLayers

pytestmark = pytest.mark.gpu


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def setup(name, batch, context, max_context):
    model = MODELS[name]
    layers = random_layers(model, seed=3, dtype=torch.float16, device="cuda")
    store = HostStore(model, batch, max_context)
    fill(store, layers, context, seed=5, device="cuda")
    return model, layers, store


def test_pinned_memory_has_the_size_asked():
    import cupy

    memory = PinnedHostMemory(10**6 + 1)
    assert memory.bytes.numel() == 10**6 + 1 and memory.bytes.data_ptr() == memory.address
    host = 1  # cudaMemoryTypeHost: page-locked (torch's is_pinned only knows its own allocator)
    assert cupy.cuda.runtime.pointerGetAttributes(memory.address).type == host
    address = memory.address
    del memory  # unregistered: the driver no longer knows the address
    assert cupy.cuda.runtime.pointerGetAttributes(address).type != host


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
@pytest.mark.parametrize("split", ["none", "some", "all"])
def test_kvpr_steps_on_the_gpu_equal_resident_steps(name, split):
    model, layers, store = setup(name, batch=3, context=13, max_context=16)
    assert store.pinned
    resident = ResidentDecoder(model, layers, store, "cuda")
    kvpr = KVPRDecoder(model, layers, store, "cuda", num_chunks=3)
    hidden = torch.randn(3, model.hidden_size, device="cuda", dtype=torch.float16)
    h_ref, h_kvpr = hidden, hidden
    for _ in range(3):
        s = store.length
        l = {"none": 0, "some": 5, "all": s}[split]
        h_ref, h_kvpr = resident.step(h_ref), kvpr.step(h_kvpr, l)
        torch.cuda.synchronize()
        assert rel_l2(h_kvpr, h_ref) < 2e-3
        assert rel_l2(store.k[:, s], resident.k[:, s].cpu()) < 2e-3


@pytest.mark.parametrize("schedule", ["row", "column"])
def test_offloaded_weights_and_gpu_batches_on_the_gpu_equal_resident_steps(schedule):
    model = MODELS["tiny-llama"]
    layers = random_layers(model, seed=3, dtype=torch.float16, device="cuda")
    stores = [HostStore(model, 2, 40) for _ in range(3)]
    for g, store in enumerate(stores):
        fill(store, layers, 30, seed=5 + g, device="cuda")
    residents = [ResidentDecoder(model, layers, store, "cuda") for store in stores]
    kvpr = KVPRDecoder(model, HostLayers(layers), stores, "cuda", num_chunks=2,
                       schedule=schedule, record_spans=True)
    hidden = torch.randn(6, model.hidden_size, device="cuda", dtype=torch.float16)
    for l in (0, 11, 32):
        expected = torch.cat([r.step(h) for r, h in zip(residents, hidden.split(2),
                                                         strict=True)])
        hidden, got = expected, kvpr.step(hidden, l)
        assert rel_l2(got, expected) < 2e-3
    spans = kvpr.last_spans.spans()
    loads = [s for s in spans if s["name"].startswith("W_")]
    per_layer = 1 if schedule == "column" else 3
    assert len(loads) == 2 * model.num_layers * per_layer
    for layer in range(model.num_layers):
        mine = [s for s in spans if s["layer"] == layer and s["batch"] == 0]
        w_kv = next(s for s in mine if s["name"] == "W_KV")
        w_rest = next(s for s in mine if s["name"] == "W_rest")
        first_x = min(s["start_us"] for s in mine if s["name"].startswith("X["))
        assert w_kv["end_us"] <= first_x + 1.0 and first_x <= w_rest["start_us"] + 1.0
        assert all(s["start_us"] >= w_kv["end_us"] - 1.0 for s in mine
                   if s["name"].startswith("recompute"))


@pytest.mark.parametrize("name", ["opt-6.7b", "llama3-8b"])
def test_cuda_graphs_give_the_eager_steps_at_real_shapes(name):
    """Two layers of the real model, 8 x 300 tokens: the graphed layers, the eager ones and the
    resident cache agree step after step (the graphs read the position from the device)."""
    model = dataclasses.replace(MODELS[name], num_layers=2)
    layers = random_layers(model, seed=3, dtype=torch.float16, device="cuda")
    stores = [HostStore(model, 8, 304) for _ in range(2)]
    for store in stores:
        fill(store, layers, 300, seed=5, device="cuda")
    resident = ResidentDecoder(model, layers, stores[0], "cuda")
    graphed, eager = (KVPRDecoder(model, layers, store, "cuda", cuda_graphs=on)
                      for store, on in zip(stores, (True, False), strict=True))
    hidden = torch.randn(8, model.hidden_size, device="cuda", dtype=torch.float16)
    h_ref = h_graphed = h_eager = hidden
    for l in (0, 120, 302):
        h_ref = resident.step(h_ref)
        h_graphed, h_eager = graphed.step(h_graphed, l), eager.step(h_eager, l)
        assert rel_l2(h_graphed, h_eager) < 1e-3 and rel_l2(h_graphed, h_ref) < 2e-3
    torch.cuda.synchronize()
    for a, b in ((stores[0].k, stores[1].k), (stores[0].x, stores[1].x)):
        assert rel_l2(a[:, 300:303], b[:, 300:303]) < 1e-3


def test_stream_spans_order_copies_before_their_use():
    model, layers, store = setup("tiny-llama", batch=4, context=300, max_context=302)
    kvpr = KVPRDecoder(model, layers, store, "cuda", num_chunks=4, record_spans=True)
    kvpr.step(torch.zeros(4, model.hidden_size, device="cuda", dtype=torch.float16), 120)
    spans = kvpr.last_spans.spans()
    assert {s["lane"] for s in spans} == {"H2D", "compute", "D2H"}
    for lane in ("H2D", "compute", "D2H"):  # one stream each: its operations never overlap
        ordered = sorted((s for s in spans if s["lane"] == lane), key=lambda s: s["start_us"])
        pairs = zip(ordered, ordered[1:], strict=False)
        assert all(a["end_us"] <= b["start_us"] + 1.0 for a, b in pairs)
    for layer in range(model.num_layers):
        mine = {s["name"]: s for s in spans if s["layer"] == layer}
        for name, span in mine.items():
            if name.startswith("recompute"):
                copied = mine[name.replace("recompute ", "X")]
                assert span["start_us"] >= copied["end_us"] - 1.0
        assert mine["layer"]["start_us"] >= mine["KV[120:300]"]["end_us"] - 1.0
        assert mine["new token"]["start_us"] >= mine["layer"]["end_us"] - 1.0


def test_profile_measures_this_gpu():
    model = MODELS["tiny-llama"]
    rates = profile(model, batch=4, context=1024)
    assert rates.source == f"measured on {torch.cuda.get_device_name()}"
    assert rates.h2d_bytes_per_s > 0 and rates.recompute_flops_per_s > 0
    assert rates.d2h_bytes_per_s > 0 and 0 < rates.layer_seconds < 0.01
    assert rates.unit_host_seconds == rates.chunk_host_seconds == 0  # no decoder given
    model, layers, store = setup("tiny-llama", batch=4, context=64, max_context=66)
    graphed, eager = (KVPRDecoder(model, layers, store, "cuda", num_chunks=2, cuda_graphs=on)
                      for on in (True, False))
    rates = profile(model, batch=4, context=64, decoder=graphed)
    assert 0 < rates.unit_host_seconds < 0.01 and 0 < rates.chunk_host_seconds < 0.01
    assert store.length == 64  # restored
    assert host_seconds(eager)[0] > rates.unit_host_seconds  # the graphs save host calls
    store.length = 1
    with pytest.raises(ValueError, match="stores hold 1 tokens: host_seconds needs at least"):
        host_seconds(graphed)
    assert link_bytes_per_s("cuda", "d2h", num_bytes=2**20) > 0
