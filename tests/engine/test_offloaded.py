"""kvlab.LLM(..., offload=True): the K, V in a host store, each decode step through the KVPR
runtime. On the CPU (the runtime without streams) its tokens equal the paged engine's on the same
weights, at both ends of the split (everything copied, everything recomputed); bad input is
refused before anything runs. On a GPU, with the rates measured there."""

import pytest
import torch

import kvlab
from kvlab.offload.scheduler import LinkAndCompute

FAMILIES = ["tiny-llama", "tiny-qwen", "tiny-opt"]
COPY_ALL = LinkAndCompute(55e9, 1e9, "what-if")  # recomputing is never worth it: l = 0
RECOMPUTE_ALL = LinkAndCompute(55e9, 1e18, "what-if")  # recomputing is free: l = s'


def prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1000, (length,), generator=gen).tolist() for _ in range(n)]


def pair(name: str, rates: LinkAndCompute, **kwargs):
    """A paged LLM and an offloaded one on the same weight tensors."""
    paged = kvlab.LLM(name, device="cpu", num_blocks=64, **kwargs)
    return paged, kvlab.LLM(name, device="cpu", offload=True, offload_rates=rates,
                            weights=paged.weights, **kwargs)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("rates", [COPY_ALL, RECOMPUTE_ALL], ids=["copy_all", "recompute_all"])
def test_offloaded_tokens_are_the_paged_engines(name, rates):
    paged, offloaded = pair(name, rates)
    batch = prompts(3, 13)
    out = offloaded.generate(batch, max_new_tokens=12)
    assert out.tokens == paged.generate(batch, max_new_tokens=12).tokens
    assert out.attention == "kvpr" and out.step_batch == [3] * 11 and len(out.step_ms) == 11
    # with GQA, X is larger than the K, V it recomputes: KVPR copies them at any rates
    model = offloaded.model
    recompute = rates is RECOMPUTE_ALL and model.num_kv_heads == model.num_qo_heads
    assert out.splits == (list(range(13, 24)) if recompute else [0] * 11)  # l = s' or 0
    assert out.finish_reasons == ["length"] * 3 and out.preemptions == 0


def test_sampling_and_eos_follow_the_paged_engine():
    """Temperature and top-p draw what the paged engine draws (one draw per request after the
    prefill, one per step for the batch); a request that meets its EOS stops there while the
    others go on (greedy: once the paged engine's batch shrinks, its draws differ)."""
    paged, offloaded = pair("tiny-opt", RECOMPUTE_ALL)
    batch = prompts(3, 9, seed=1)
    kwargs = {"max_new_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 5}
    assert offloaded.generate(batch, **kwargs).tokens == paged.generate(batch, **kwargs).tokens
    greedy = offloaded.generate(batch, max_new_tokens=10)
    eos = greedy.tokens[1][3]
    stopped = offloaded.generate(batch, max_new_tokens=10, eos_token_id=eos)
    assert stopped.tokens == paged.generate(batch, max_new_tokens=10, eos_token_id=eos).tokens
    assert stopped.finish_reasons[1] == "eos" and stopped.tokens[1][-1] == eos
    assert len(stopped.tokens[1]) <= 4 and stopped.step_batch == [3] * 9


def test_a_batch_longer_than_a_prefill_pass_is_prefilled_in_parts():
    paged, offloaded = pair("tiny-opt", RECOMPUTE_ALL, max_prefill_tokens=20)
    batch = prompts(5, 9, seed=2)  # two prompts a pass: three passes
    out = offloaded.generate(batch, max_new_tokens=5)
    assert out.tokens == paged.generate(batch, max_new_tokens=5).tokens


def test_one_new_token_needs_no_decode_step():
    paged, offloaded = pair("tiny-llama", COPY_ALL)
    batch = prompts(2, 5)
    out = offloaded.generate(batch, max_new_tokens=1)
    assert out.tokens == paged.generate(batch, max_new_tokens=1).tokens
    assert out.step_ms == [] and out.splits == []


@pytest.mark.parametrize(("call", "message"), [
    (lambda llm: llm.generate([[1, 2, 3], [4, 5]], 4),
     "prompts: lengths [2, 3]; offload=True runs a batch of one prompt length"),
    (lambda llm: llm.generate([[1, 2], [4, 5]], [4, 5]),
     "max_new_tokens: [4, 5]; offload=True runs one limit for the whole batch"),
    (lambda llm: llm.generate([[1, 2]], 4, arrivals=[0.0]),
     "arrivals: offload=True runs the batch at once"),
    (lambda llm: llm.with_attention("reference"),
     "with_attention: this LLM decodes through KVPR"),
])
def test_what_one_host_store_cannot_run_is_refused(call, message):
    llm = kvlab.LLM("tiny-llama", device="cpu", offload=True, offload_rates=COPY_ALL)
    with pytest.raises(ValueError, match=message.replace("[", "\\[").replace("]", "\\]")):
        call(llm)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"offload": "yes"}, "offload='yes': must be a bool"),
    ({"offload_rates": COPY_ALL}, "offload_rates=.*: only with offload=True"),
    ({"offload": True}, "offload_rates=None: a CPU run needs the link and GPU rates given"),
    ({"offload": True, "offload_rates": 5}, "offload_rates=5: must be None or a "),
    ({"offload": True, "offload_rates": COPY_ALL, "attention": "reference"},
     "attention='reference': offload=True decodes through the KVPR runtime"),
    ({"offload": True, "offload_rates": COPY_ALL, "num_blocks": 8},
     "num_blocks=8: offload=True decodes through the KVPR runtime"),
    ({"offload": True, "offload_rates": COPY_ALL, "cuda_graphs": "no"},
     "cuda_graphs='no': must be None or a bool"),
    ({"offload": True, "offload_rates": COPY_ALL, "async_decode": True},
     "async_decode=True: offload=True decodes through the KVPR runtime"),
    ({"offload": True, "offload_rates": COPY_ALL, "ahead_bytes": 4096},
     "ahead_bytes=4096: offload=True decodes through the KVPR runtime"),
    ({"offload": True, "offload_rates": COPY_ALL, "ahead_kv_bytes": 4096},
     "ahead_kv_bytes=4096: offload=True decodes through the KVPR runtime"),
])
def test_bad_offload_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kvlab.LLM("tiny-llama", device="cpu", **kwargs)


@pytest.mark.gpu
def test_on_a_gpu_the_rates_are_measured_and_the_tokens_are_the_paged_engines():
    """fp32 on both sides (greedy tokens of tiny random models sit near ties in fp16): the paged
    engine with the reference attention, the offloaded one with pinned stores, its streams and
    its CUDA graphs, and rates profiled on this GPU."""
    paged = kvlab.LLM("tiny-llama", device="cuda", dtype=torch.float32, attention="reference",
                      num_blocks=64)
    offloaded = kvlab.LLM("tiny-llama", device="cuda", dtype=torch.float32, offload=True,
                          weights=paged.weights)
    batch = prompts(4, 40)
    out = offloaded.generate(batch, max_new_tokens=16)
    assert out.tokens == paged.generate(batch, max_new_tokens=16).tokens
    assert len(out.splits) == 15 and all(0 <= s <= 40 + i for i, s in enumerate(out.splits))
