"""The KVPR runtime's decode steps equal those with the whole KV resident, at every split, for
OPT, Llama and Qwen2 layers (CPU here; the GPU run checks the same with streams)."""

import dataclasses
import re

import pytest
import torch
from factories import make_cpu_stores, placed

from kvlab.config import MODELS
from kvlab.model.weights import random_layers
from kvlab.offload.host import HostStore, PinnedHostMemory, fill, store_bytes
from kvlab.offload.runtime import KVPRDecoder, ResidentDecoder
from kvlab.offload.scheduler import token_chunks
from kvlab.offload.weights import HostLayers

BATCH, CONTEXT, MAX_CONTEXT = 3, 13, 16


def filled(name, dtype=torch.float32):
    model = MODELS[name]
    layers = random_layers(model, seed=3, dtype=dtype)
    store = HostStore(model, BATCH, MAX_CONTEXT, dtype=dtype, pinned=False)
    fill(store, layers, CONTEXT, seed=5)
    return model, layers, store


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama", "tiny-qwen"])
@pytest.mark.parametrize("split", ["none", "some", "all"])
def test_kvpr_steps_equal_resident_steps(name, split):
    model, layers, store = filled(name)
    resident = ResidentDecoder(model, layers, store, "cpu")
    kvpr = KVPRDecoder(model, layers, store, "cpu", num_chunks=3)
    hidden = torch.randn(BATCH, model.hidden_size, generator=torch.Generator().manual_seed(9))
    h_ref, h_kvpr = hidden, hidden
    for _ in range(3):
        s = store.length
        l = {"none": 0, "some": 5, "all": s}[split]
        h_ref, h_kvpr = resident.step(h_ref), kvpr.step(h_kvpr, l)
        torch.testing.assert_close(h_kvpr, h_ref, rtol=1e-5, atol=1e-5)
        # the new token went back to the host as the resident cache holds it
        torch.testing.assert_close(store.k[:, s], resident.k[:, s])
        torch.testing.assert_close(store.v[:, s], resident.v[:, s])
    assert store.length == CONTEXT + 3


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-llama"])
@pytest.mark.parametrize("schedule", ["row", "column"])
@pytest.mark.parametrize("weights", ["resident", "offloaded"])
def test_gpu_batches_schedules_and_offloaded_weights_equal_resident_steps(name, schedule,
                                                                          weights):
    model = MODELS[name]
    layers = random_layers(model, seed=3)
    stores = make_cpu_stores(model, layers, 3, BATCH, MAX_CONTEXT, CONTEXT, seed=5)
    kvpr = KVPRDecoder(model, placed(layers, weights), stores, "cpu", num_chunks=2,
                       schedule=schedule)
    assert kvpr.batch == 3 * BATCH and kvpr.weights == weights
    residents = [ResidentDecoder(model, layers, store, "cpu") for store in stores]
    hidden = torch.randn(3 * BATCH, model.hidden_size, generator=torch.Generator().manual_seed(9))
    for l in (0, 6, CONTEXT + 1):
        expected = torch.cat([r.step(h) for r, h in zip(residents, hidden.split(BATCH),
                                                         strict=True)])
        hidden, got = expected, kvpr.step(hidden, l)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert all(store.length == CONTEXT + 3 for store in stores)


def test_units_follow_the_schedule():
    model = MODELS["tiny-opt"]  # 2 layers
    layers = random_layers(model, seed=3)
    stores = [HostStore(model, 1, 4, dtype=torch.float32, pinned=False) for _ in range(2)]
    row = KVPRDecoder(model, layers, stores, "cpu", schedule="row").units()
    column = KVPRDecoder(model, layers, stores, "cpu", schedule="column").units()
    assert row == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert column == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_mismatched_stores_and_schedules_are_refused():
    model = MODELS["tiny-opt"]
    layers = random_layers(model, seed=3)
    a = HostStore(model, 2, 8, dtype=torch.float32, pinned=False)
    b = HostStore(model, 3, 8, dtype=torch.float32, pinned=False)
    with pytest.raises(ValueError, match=r"stores\[1\]: model, batch, max_context and dtype"):
        KVPRDecoder(model, layers, [a, b], "cpu")
    with pytest.raises(ValueError, match="schedule='diagonal': must be one of"):
        KVPRDecoder(model, layers, a, "cpu", schedule="diagonal")
    with pytest.raises(ValueError, match="stores is empty"):
        KVPRDecoder(model, layers, [], "cpu")
    half = HostLayers(random_layers(model, seed=3, dtype=torch.float16), pinned=False)
    with pytest.raises(ValueError, match="layers: offloaded as torch.float16, the stores hold "
                                         "torch.float32"):
        KVPRDecoder(model, half, a, "cpu")
    other = HostStore(MODELS["tiny-llama"], 2, 8, dtype=torch.float32, pinned=False)
    with pytest.raises(ValueError, match="stores hold tiny-llama's layers, not tiny-opt's"):
        KVPRDecoder(model, layers, other, "cpu")
    c = HostStore(model, 2, 8, dtype=torch.float32, pinned=False)
    fill(c, layers, 3)
    kvpr = KVPRDecoder(model, layers, [a, c], "cpu")
    with pytest.raises(ValueError, match=r"lengths \[0, 3\] must be equal"):
        kvpr.step(torch.zeros(4, model.hidden_size), 0)


def wrong_layers(case):
    """tiny-llama's float32 layers, with one thing wrong, and the error that names it."""
    model = MODELS["tiny-llama"]
    layers = random_layers(model, seed=3)
    if case == "model":
        return random_layers(MODELS["tiny-opt"], seed=3), (
            "layers[0].attn.w_k: shape (256, 256), must be (128, 256) for tiny-llama")
    if case == "dtype":
        return random_layers(model, seed=3, dtype=torch.float16), (
            "layers[0].attn.w_k: torch.float16, must be torch.float32")
    if case == "one tensor":
        layers[1] = dataclasses.replace(layers[1], w_up=layers[1].w_up.double())
        return layers, "layers[1].w_up: torch.float64, must be torch.float32"
    if case == "one shape":
        layers[1] = dataclasses.replace(layers[1], w_down=layers[1].w_down[:, :-1])
        return layers, "layers[1].w_down: shape (256, 511), must be (256, 512) for tiny-llama"
    if case == "missing":
        layers[0] = dataclasses.replace(layers[0], w_gate=None)
        return layers, "layers[0].w_gate: None, must be (512, 256) for tiny-llama"
    if case == "extra":
        layers[1] = dataclasses.replace(layers[1], b_up=torch.zeros(512))
        return layers, "layers[1].b_up: shape (512,), must be None for tiny-llama"
    if case == "device":
        return random_layers(model, seed=3, device="meta"), (
            "layers[0].attn.w_k: on meta, must be on cpu")
    if case == "not layers":
        return [layers[0], layers[1].attn], "layers[1]: AttentionWeights, must be LayerWeights"
    count = {"fewer": 1, "more": 3}[case]
    return random_layers(model, seed=3, num_layers=count), (
        f"len(layers)={count}: must be tiny-llama's 2")


WRONG = ["model", "dtype", "one tensor", "one shape", "missing", "extra", "device", "not layers",
         "fewer", "more"]


@pytest.mark.parametrize("case", WRONG)
def test_layers_of_another_model_dtype_or_device_are_refused(case):
    layers, message = wrong_layers(case)
    store = HostStore(MODELS["tiny-llama"], 2, 8, dtype=torch.float32, pinned=False)
    with pytest.raises(ValueError, match=re.escape(message)):
        KVPRDecoder(MODELS["tiny-llama"], layers, store, "cpu")


@pytest.mark.parametrize("case", WRONG)
def test_fill_refuses_layers_of_another_model_dtype_or_device(case):
    layers, message = wrong_layers(case)
    store = HostStore(MODELS["tiny-llama"], 2, 8, dtype=torch.float32, pinned=False)
    for t in (store.k, store.v, store.x):
        t.fill_(7.0)
    with pytest.raises(ValueError, match=re.escape(message)):
        fill(store, layers, 5)
    assert store.length == 0  # nothing written
    assert all(t.eq(7.0).all() for t in (store.k, store.v, store.x))


def test_bf16_steps_agree_within_bf16_rounding():
    model, layers, store = filled("tiny-llama", torch.bfloat16)
    resident = ResidentDecoder(model, layers, store, "cpu")
    kvpr = KVPRDecoder(model, layers, store, "cpu")
    hidden = torch.randn(BATCH, model.hidden_size, generator=torch.Generator().manual_seed(1))
    hidden = hidden.to(torch.bfloat16)
    torch.testing.assert_close(kvpr.step(hidden, 7), resident.step(hidden), rtol=2e-2, atol=2e-2)


def test_chunks_cover_the_prefix_in_order():
    for l in range(0, 40):
        for n in (1, 3, 8):
            chunks = token_chunks(l, n)
            assert len(chunks) == min(l, n)
            assert [t for a, b in chunks for t in range(a, b)] == list(range(l))


def test_bad_steps_are_refused_before_any_work():
    model, layers, store = filled("tiny-opt")
    kvpr = KVPRDecoder(model, layers, store, "cpu")
    hidden = torch.zeros(BATCH, model.hidden_size)
    with pytest.raises(ValueError, match=r"l=14: must be an integer in \[0, s'=13\]"):
        kvpr.step(hidden, 14)
    with pytest.raises(ValueError, match=r"hidden: shape \(2, 256\)"):
        kvpr.step(torch.zeros(2, model.hidden_size), 0)
    assert store.length == CONTEXT
    for _ in range(MAX_CONTEXT - CONTEXT):
        kvpr.step(hidden, 0)
    with pytest.raises(ValueError, match="max_context=16: the store is full"):
        kvpr.step(hidden, 0)
    with pytest.raises(ValueError, match="len\\(layers\\)=1: must be tiny-opt's 2"):
        KVPRDecoder(model, layers[:1], store, "cpu")


def test_store_budget_is_checked_before_allocating():
    model = MODELS["llama2-7b"]
    need = store_bytes(model, 16, 1024)
    # 32 layers x 16 x 1024 tokens x (2 x 4096 K, V + 4096 X) x 2 bytes
    assert need["total"] == 32 * 16 * 1024 * 3 * 4096 * 2
    with pytest.raises(ValueError, match=r"budget_bytes=1,000,000: the store needs 12,884,901,888"):
        HostStore(model, 16, 1024, budget_bytes=1_000_000)


def test_fill_refuses_a_context_beyond_the_store():
    model, layers, store = filled("tiny-opt")
    with pytest.raises(ValueError, match=r"context=17: must be in \[0, max_context=16\]"):
        fill(store, layers, 17)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_pinned_memory_without_cuda_is_an_error():
    with pytest.raises(RuntimeError, match="num_bytes=4096: pinned host memory needs a CUDA"):
        PinnedHostMemory(4096)
