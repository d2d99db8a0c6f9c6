"""kvlab.LLM on hostile input: every exit from generate gives the blocks back and leaves the LLM
usable; a request that can never be admitted is refused, not waited on; extreme sampling values
sample right; sizes are checked before anything is allocated; numbers and flags are checked as
kvlab.checks words them (numpy scalars accepted, bools never taken for numbers)."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from factories import no_hang

import kvlab
from kvlab.cache import paged_cache
from kvlab.config import MODELS
from kvlab.engine import forward, generation
from kvlab.engine import runner as runner_module
from kvlab.engine import scheduler as scheduler_module
from kvlab.engine import weights as weights_module
from kvlab.engine.runner import sample
from kvlab.engine.weights import ModelWeights
from kvlab.model.rope import RopeTable
from kvlab.offload.scheduler import LinkAndCompute

COPY_ALL = LinkAndCompute(55e9, 1e9, "what-if")


def tokens(n: int, seed: int, vocab: int = 1024) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def fail_on_call(number: int, error: BaseException):
    """A callable that raises `error` on its `number`-th call (from 1)."""
    calls = []

    def call(*_):
        calls.append(1)
        if len(calls) == number:
            raise error
    return call


# ---- 1: every exit gives the blocks back ---------------------------------------------------


def test_a_failing_on_finish_leaves_no_block_held_and_a_later_request_runs():
    """The issue's example: before, the blocks of the first generate stayed held and the
    second, which needs the whole cache, was never admitted (the loop spun forever)."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=4)
    with pytest.raises(ZeroDivisionError):
        llm.generate([[1, 2, 3]], 8, on_finish=lambda d, t: 1 / 0)
    assert llm.manager.num_free_blocks == 4 and not llm.manager.seq_ids
    with no_hang():
        out = llm.generate([[5] * 60], 4)
    fresh = kvlab.LLM("tiny-llama", device="cpu", num_blocks=4, weights=llm.weights)
    assert out.tokens == fresh.generate([[5] * 60], 4).tokens


def _prefill_fails(monkeypatch):
    """The second prefill pass raises (its requests placed, not prefilled)."""
    prefill, calls = forward.prefill, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return prefill(*args)
    monkeypatch.setattr(forward, "prefill", failing)


def _sampling_fails(monkeypatch):
    """The 20th draw raises (a request preempted and waiting by then)."""
    sample = runner_module.sample
    failing = fail_on_call(20, RuntimeError("sampling failed"))

    def sampling(*args):
        failing()
        return sample(*args)
    monkeypatch.setattr(runner_module, "sample", sampling)


def _step_wait_fails(monkeypatch):
    """Waiting for a decode step's tokens is interrupted (a step queued ahead with
    async_decode)."""
    wait = generation.SampledTokens.wait
    failing = fail_on_call(12, KeyboardInterrupt())

    def interrupted(self):
        failing()
        return wait(self)
    monkeypatch.setattr(generation.SampledTokens, "wait", interrupted)


@pytest.mark.parametrize("async_decode", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fail", [_prefill_fails, _sampling_fails, _step_wait_fails],
                         ids=["prefill", "sampling", "step_wait"])
def test_any_exception_in_generate_gives_every_block_back(monkeypatch, fail, async_decode):
    """Four requests squeezed into 8 blocks (waiting, preempted, running, placed but not
    prefilled): whatever raises, every block comes back and the next generate gives the tokens
    of a fresh LLM."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, max_prefill_tokens=30,
                    async_decode=async_decode)
    prompts = [tokens(30, seed=20 + i) for i in range(4)]
    fresh = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, weights=llm.weights)
    want = fresh.generate(prompts, 30).tokens
    with monkeypatch.context() as patch:
        fail(patch)
        with pytest.raises((KeyboardInterrupt, RuntimeError)), no_hang():
            llm.generate(prompts, 30, temperature=0.5)
    assert llm.manager.num_free_blocks == 8 and not llm.manager.seq_ids
    with no_hang():
        assert llm.generate(prompts, 30).tokens == want


def test_an_exception_with_offload_leaves_the_llm_usable():
    llm = kvlab.LLM("tiny-llama", device="cpu", offload=True, offload_rates=COPY_ALL)
    batch = [tokens(13, seed=i) for i in range(3)]
    want = llm.generate(batch, 6).tokens
    with pytest.raises(KeyboardInterrupt):
        llm.generate(batch, 6, on_finish=fail_on_call(2, KeyboardInterrupt()))
    assert llm.generate(batch, 6).tokens == want


def test_a_request_the_free_blocks_can_never_hold_is_refused_not_waited_on():
    """The twin of a shared cache holds blocks: a request that needs more than the rest is
    refused before anything runs (before, the loop waited for blocks no one would free)."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8)
    twin = llm.with_attention("reference", share_cache=True)
    held = twin.manager.add_sequence(5 * 16).seq_id
    with no_hang(), pytest.raises(ValueError, match=(
            r"prompts\[1\]: 70 tokens need 5 blocks; 3 of the cache's 8 blocks for requests are "
            r"free, the others hold sequences outside this generate")):
        llm.generate([[1] * 10, [2] * 60], 10)
    assert llm.manager.num_free_blocks == 3 and llm.manager.seq_ids == [held]
    assert llm.generate([[1] * 10], 10).tokens == twin.generate([[1] * 10], 10).tokens


def test_blocks_taken_outside_while_requests_wait_end_the_generate_not_hang_it():
    """on_finish fills the shared cache when the first request ends, before the second has
    arrived: it could never be admitted; generate raises (before, it waited forever) and gives
    back what its own requests held."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8)
    twin = llm.with_attention("reference", share_cache=True)
    taken = []

    def take_all(done, total):
        if not taken:
            taken.append(twin.manager.add_sequence(twin.manager.num_free_blocks * 16).seq_id)

    with no_hang(), pytest.raises(RuntimeError, match=(
            r"request 1 \(60 tokens, 4 blocks\) can never be admitted: nothing runs to free "
            r"blocks, and 1 of the cache's 8 blocks for requests is free")):
        llm.generate([[1] * 10, [2] * 60], [2, 4], arrivals=[0.0, 0.3], on_finish=take_all)
    assert llm.manager.seq_ids == taken
    twin.manager.free(taken[0])
    assert llm.manager.num_free_blocks == 8


# ---- 3: extreme sampling values sample right -----------------------------------------------


@pytest.mark.parametrize("kwargs", [{"temperature": 1e-300}, {"temperature": 5e-324},
                                    {"temperature": 1e-40}, {"temperature": 0.7, "top_p": 1e-50},
                                    {"temperature": 1.0, "top_p": 5e-324}])
def test_a_tiny_temperature_or_top_p_samples_the_greedy_tokens(kwargs):
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=32)
    prompt = tokens(8, seed=3)
    assert llm.generate(prompt, 16, **kwargs).tokens == llm.generate(prompt, 16).tokens


def test_sampling_never_overflows_and_splits_ties_in_the_limit():
    logits = torch.tensor([[3e38, 3e38, -3e38, 0.0], [1.0, 5.0, 5.0 - 1e-6, 2.0]])
    gen = torch.Generator().manual_seed(0)
    picks = torch.stack([sample(logits, 1e-300, 1.0, gen) for _ in range(200)])
    assert set(picks[:, 0].tolist()) == {0, 1} and set(picks[:, 1].tolist()) == {1}
    assert sample(logits[1:], 1.0, 5e-324, gen).tolist() == [1]  # the top token only
    flat = torch.stack([sample(logits, 1e300, 1.0, gen) for _ in range(200)])
    assert set(flat[:, 1].tolist()) == {0, 1, 2, 3}  # uniform in the limit


# ---- 8, 9: sizes checked, tables sized by use, before anything is allocated ----------------


def _no_allocation(monkeypatch) -> None:
    """Make the cache's manager, and random weights anywhere but on the meta device (sizes, no
    memory), fail the test."""
    def allocating(*args, **kwargs):
        raise AssertionError("allocated before the size check")

    random = ModelWeights.random.__func__

    def sized_only(cls, model, seed=0, dtype=torch.float32, device="cpu"):
        assert str(device) == "meta", "allocated before the size check"
        return random(cls, model, seed, dtype, device)

    monkeypatch.setattr(runner_module, "BlockManager", allocating)
    monkeypatch.setattr(ModelWeights, "random", classmethod(sized_only))


def test_a_cache_too_large_is_refused_before_anything_is_allocated(monkeypatch):
    _no_allocation(monkeypatch)
    for num_blocks in (10**8, 2**70):
        with pytest.raises(ValueError, match=f"num_blocks={num_blocks}: the K/V tensors of 2 "
                                             r"layers \([0-9,]+ bytes\) need "):
            kvlab.LLM("tiny-llama", device="cpu", num_blocks=num_blocks)


def test_weights_and_a_cache_that_fit_only_apart_are_refused_before_either_is_made(monkeypatch):
    """Each checked alone against the free memory, both passed, and the cache ran out of memory
    a layer at a time after the weights were made."""
    c = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64).runner.config
    m = c.model
    weights = ModelWeights.random(m, device="meta").nbytes
    cache = m.num_layers * runner_module.cache_nbytes(
        64, c.block_size, m.num_kv_heads, m.head_dim, c.dtype,
        runner_module.cache_layout(c.attention))
    _no_allocation(monkeypatch)
    monkeypatch.setattr(paged_cache, "_free_bytes", lambda device: max(weights, cache) + 1)
    with pytest.raises(ValueError, match=f"model='tiny-llama': its weights \\({weights:,} bytes\\) "
                                         f"and num_blocks=64: the K/V tensors of 2 layers "
                                         f"\\({cache:,} bytes\\) need {weights + cache:,} bytes"):
        kvlab.LLM("tiny-llama", device="cpu", num_blocks=64)


def test_the_rope_table_covers_what_the_cache_can_hold_not_the_context_limit(monkeypatch):
    """max_position 10**8 (a checkpoint may say so): before, a 51 GB table up front."""
    build, sizes = RopeTable.build.__func__, []

    def recording(cls, model, max_positions, dtype, device):
        sizes.append(max_positions)
        assert max_positions <= 10**6, "a table sized by the context limit"
        return build(cls, model, max_positions, dtype, device)

    monkeypatch.setattr(RopeTable, "build", classmethod(recording))
    long = dataclasses.replace(MODELS["tiny-llama"], name="long", max_position=10**8)
    llm = kvlab.LLM(long, device="cpu", num_blocks=8, block_size=16)
    assert sizes == [8 * 16] and llm.rope.cos.shape[0] == 8 * 16
    prompt = tokens(100, seed=1)
    short = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, weights=llm.weights)
    assert llm.generate(prompt, 28).tokens == short.generate(prompt, 28).tokens
    offloaded = kvlab.LLM(long, device="cpu", offload=True, offload_rates=COPY_ALL,
                          weights=llm.weights)
    assert offloaded.generate(prompt, 28).tokens == short.generate(prompt, 28).tokens
    assert max(sizes) <= 128


def test_random_weights_that_cannot_fit_are_refused_before_they_are_made(monkeypatch):
    """OPT's learned positions are weights of max_position + 2 rows: a ModelConfig of 10**12
    positions asks for a table of 1 TB."""
    seeded = weights_module.seeded_randn

    def bounded(seed, dtype, device):
        rand = seeded(seed, dtype, device)

        def checked(*shape, scale=1.0):
            assert str(device) == "meta" or math.prod(shape) < 10**8, "allocated first"
            return rand(*shape, scale=scale)
        return checked

    monkeypatch.setattr(weights_module, "seeded_randn", bounded)
    huge = dataclasses.replace(MODELS["tiny-opt"], name="huge-opt", max_position=10**12)
    with pytest.raises(ValueError, match="model='huge-opt': its random weights need "
                                         "1,024,000,[0-9,]+ bytes, but cpu has"):
        ModelWeights.random(huge)
    with pytest.raises(ValueError, match=r"model='huge-opt': its weights \(1,024,000"):
        kvlab.LLM(huge, device="cpu", num_blocks=8)
    assert ModelWeights.random(MODELS["tiny-opt"]).positions.shape == (514, 256)


# ---- 15, 16, 17: devices, seeds, numbers and flags -----------------------------------------


@pytest.mark.parametrize(("device", "message"), [
    ("bogus", "device='bogus': must be a torch device, e.g. 'cpu' or 'cuda:0'"),
    ("", "device='': must be a torch device"),
    (1.5, "device=1.5: must be a torch device"),
    (True, "device=True: must be a torch device"),
    pytest.param("cuda", "device=cuda: no such CUDA device \\(0 visible\\)",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
    ("cuda:99", "device=cuda:99: no such CUDA device"),
    pytest.param(3, "device=3: must be a torch device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
])
def test_bad_devices_are_refused_in_the_caches_words(device, message):
    with pytest.raises(ValueError, match=message):
        kvlab.LLM("tiny-llama", device=device, num_blocks=8)
    with pytest.raises(ValueError, match=message):
        ModelWeights.random(MODELS["tiny-llama"], device=device)


def test_the_engine_runs_on_the_cpu_or_a_gpu_only():
    """The meta device (sizes without memory) was taken, and generate failed inside torch."""
    with pytest.raises(ValueError, match="device='meta': the engine runs on 'cpu' or 'cuda' "
                                         "\\(a CUDA device's index too\\), not on 'meta'"):
        kvlab.LLM("tiny-llama", device="meta", num_blocks=8)


@pytest.fixture(scope="module")
def small():
    return kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, block_size=16)


def test_numpy_scalars_are_taken_as_the_numbers_they_are(small):
    prompt = tokens(8, seed=3)
    want = small.generate(prompt, 6, temperature=0.7, top_p=0.9, seed=5,
                          eos_token_id=7).tokens
    got = small.generate([np.int64(t) for t in prompt], np.int64(6), temperature=np.float64(0.7),
                         top_p=np.float32(0.9), seed=np.int64(5), eos_token_id=np.int32(7),
                         ignore_eos=np.False_, arrivals=[np.float32(0.0)])
    assert got.tokens == want
    assert small.generate(prompt, 6, temperature=np.float32(0.7)).tokens == small.generate(
        prompt, 6, temperature=float(np.float32(0.7))).tokens
    assert small.generate(prompt, 3, seed=2**64 - 1, temperature=1.0).tokens == \
        small.generate(prompt, 3, seed=-1, temperature=1.0).tokens  # the same 64 bits


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seed": 1.5}, "seed=1.5: must be an integer in \\[-9223372036854775808, "
                    "18446744073709551615\\]"),
    ({"seed": "7"}, "seed='7': must be an integer"),
    ({"seed": [1]}, "seed=\\[1\\]: must be an integer"),
    ({"seed": True}, "seed=True: must be an integer"),
    ({"seed": 2**70}, "seed=1180591620717411303424: must be an integer"),
    ({"temperature": True}, "temperature=True: must be a finite number >= 0"),
    ({"temperature": "0.5"}, "temperature='0.5': must be a finite number >= 0"),
    ({"temperature": math.nan}, "temperature=nan: must be a finite number >= 0"),
    ({"temperature": math.inf}, "temperature=inf: must be a finite number >= 0"),
    ({"top_p": True}, "top_p=True: must be a number in \\(0, 1\\]"),
    ({"top_p": math.nan}, "top_p=nan: must be a number in \\(0, 1\\]"),
    ({"top_p": 1.5}, "top_p=1.5: must be a number in \\(0, 1\\]"),
    ({"ignore_eos": "no"}, "ignore_eos='no': must be True or False"),
    ({"ignore_eos": 1}, "ignore_eos=1: must be True or False"),
    ({"eos_token_id": True}, "eos_token_id=True: must be None or a token id"),
    ({"eos_token_id": 2.0}, "eos_token_id=2.0: must be None or a token id"),
    ({"max_new_tokens": True}, "max_new_tokens=True: must be an integer >= 1"),
    ({"max_new_tokens": 2.0}, "max_new_tokens=2.0: must be an integer >= 1"),
    ({"max_new_tokens": "3"}, "max_new_tokens='3': must be an integer >= 1"),
    ({"arrivals": [True]}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
    ({"arrivals": [math.nan]}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
    ({"arrivals": ["0"]}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
    ({"arrivals": 5}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
    ({"arrivals": [86_401]}, "arrivals: must be 1 numbers in \\[0, 86,400\\] \\(seconds after the "
                             "call: at most a day\\)"),
    ({"on_finish": 5}, "on_finish=5: must be None or a callable"),
])
def test_bad_sampling_and_serving_arguments_are_refused(small, kwargs, message):
    with pytest.raises(ValueError, match=message):
        small.generate([[1, 2, 3]], **{"max_new_tokens": 4, **kwargs})
    assert small.manager.num_free_blocks == 8 and not small.manager.seq_ids


def test_a_far_arrival_is_waited_for_without_overflowing_the_sleep(monkeypatch):
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8)
    sleeps = []

    def sleep(seconds):  # stand in for the clock: each sleep passes the time asked
        sleeps.append(seconds)
        raise KeyboardInterrupt  # the user stops waiting
    monkeypatch.setattr(scheduler_module.time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 2], [3, 4]], 4, arrivals=[0.0, scheduler_module.MAX_ARRIVAL_S])
    assert sleeps and sleeps[0] <= 1.0
    assert llm.manager.num_free_blocks == 8


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seed": 2**70}, "seed=1180591620717411303424: must be an integer in "
                      "\\[-9223372036854775808, 9223372036854775807\\]"),
    ({"seed": 1.0}, "seed=1.0: must be an integer"),
    ({"seed": True}, "seed=True: must be an integer"),
    ({"block_size": True}, "block_size=True: must be a power of two"),
    ({"num_blocks": True}, "num_blocks=True: must be an integer >= 1"),
    ({"num_blocks": 8.0}, "num_blocks=8.0: must be an integer >= 1"),
    ({"max_prefill_tokens": True}, "max_prefill_tokens=True: must be an integer >= 1"),
    ({"graph_max_len": True}, "graph_max_len=True: must be an integer >= 1"),
    ({"offload": 1}, "offload=1: must be a bool"),
    ({"tensor_parallel": "no"}, "tensor_parallel='no': must be a bool"),
    ({"async_decode": 0}, "async_decode=0: must be None or a bool"),
    ({"cuda_graphs": 0}, "cuda_graphs=0: must be None or a bool"),
    ({"offload": True, "offload_rates": COPY_ALL, "cuda_graphs": 1},
     "cuda_graphs=1: must be None or a bool"),
    ({"offload": True, "offload_rates": COPY_ALL, "cuda_graphs": 0.0},
     "cuda_graphs=0.0: must be None or a bool"),
    ({"model": ["tiny-llama"]}, "model=\\['tiny-llama'\\]: must be a ModelConfig"),
])
def test_bad_engine_numbers_and_flags_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kvlab.LLM(**{"model": "tiny-llama", "device": "cpu", **kwargs})


def test_numpy_scalars_are_taken_by_the_constructor():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=np.int64(8),
                    block_size=np.int32(16), seed=np.int64(3), max_prefill_tokens=np.int16(64),
                    offload=np.False_, tensor_parallel=np.False_, async_decode=np.True_,
                    cuda_graphs=np.False_)
    assert (llm.manager.num_blocks, llm.block_size, llm.seed, llm.async_decode) == (8, 16, 3, True)
    assert all(type(v) in (int, bool) for v in (llm.seed, llm.block_size, llm.async_decode,
                                                llm.offload, llm.max_prefill_tokens))
    twin = llm.with_attention("reference", share_cache=np.True_)
    assert twin.manager is llm.manager
    with pytest.raises(ValueError, match="share_cache='yes': must be a bool"):
        llm.with_attention("reference", share_cache="yes")


# ---- on a GPU: the queued steps, graphs sized by the cache, sampling's division ------------


@pytest.mark.gpu
def test_on_a_gpu_an_interrupt_with_a_step_queued_gives_the_blocks_back(monkeypatch):
    """CUDA graphs and async decode: while a step queued ahead is in flight, waiting for the
    step before is interrupted. The blocks come back, the GPU's queued work is done when
    generate is left, and the next generate gives the tokens it gave before. The graphs serve
    no longer sequences than the cache holds, whatever graph_max_len says."""
    llm = kvlab.LLM("tiny-llama", attention="gqa", device="cuda", num_blocks=16,
                    graph_max_len=2**40)
    assert llm.async_decode and llm.graphs.max_seq_len == 16 * 16
    prompts = [tokens(30, seed=i) for i in range(3)]
    want = llm.generate(prompts, 40).tokens
    launch, ahead = llm._launch, []

    def recording(rows, token_ids, *args):
        ahead.append(isinstance(token_ids, torch.Tensor))
        return launch(rows, token_ids, *args)

    with monkeypatch.context() as patch:
        patch.setattr(llm, "_launch", recording)
        _step_wait_fails(patch)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts, 40)
    assert ahead[-1]  # the step queued ahead was in flight
    assert torch.cuda.current_stream().query()  # nothing left queued
    assert llm.manager.num_free_blocks == llm.usable_blocks == 15 and len(llm.manager.seq_ids) == 1
    assert llm.generate(prompts, 40).tokens == want


@pytest.mark.gpu
def test_on_a_gpu_sampling_divides_without_overflow():
    """On a GPU torch divides by a scalar as a multiplication by its reciprocal: the clamped
    temperature keeps both normal numbers."""
    logits = torch.tensor([[1.0, 5.0, 5.0 - 1e-6, 2.0], [7.0, -1.0, 3.0, 6.5]], device="cuda")
    gen = torch.Generator("cuda").manual_seed(0)
    for temperature, top_p in [(1e-300, 1.0), (5e-324, 1.0), (1e-40, 1e-50), (0.5, 5e-324)]:
        assert sample(logits, temperature, top_p, gen).tolist() == [1, 0]
    flat = torch.stack([sample(logits, 1e300, 1.0, gen) for _ in range(200)])
    assert set(flat[:, 0].tolist()) == {0, 1, 2, 3}


@pytest.mark.gpu
def test_on_a_gpu_a_missing_cuda_device_is_named():
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"device=cuda:{count}: no such CUDA device "
                                         f"\\({count} visible\\)"):
        kvlab.LLM("tiny-llama", device=f"cuda:{count}", num_blocks=8)
    assert kvlab.LLM("tiny-llama", device="cuda", num_blocks=8).device == torch.device(
        "cuda", torch.cuda.current_device())
