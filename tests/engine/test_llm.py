"""kvlab.engine on the CPU: logits and greedy tokens equal HF transformers' with the same weights;
batches, prefix sharing and waiting for blocks give the tokens the requests give alone; sampling;
every bad input refused before anything runs."""

import time

import pytest
import torch

import kvlab
from kvlab.config import MODELS
from kvlab.engine import forward
from kvlab.engine.scheduler import make_requests
from kvlab.engine.weights import ModelWeights
from kvlab.model.layer import KvAhead
from kvlab.model.weights import named_tensors

transformers = pytest.importorskip("transformers")
from kvlab.engine.hf import causal_lm  # noqa: E402  (needs transformers)

FAMILIES = ["tiny-llama", "tiny-qwen", "tiny-opt"]


def tokens(n: int, seed: int, vocab: int = 1024) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_and_decode_logits_equal_hf(name):
    """Prefill of 9 tokens, then 6 decode steps fed given tokens: each step's logits equal HF's
    over the whole sequence so far (fp32, the same weights)."""
    llm = kvlab.LLM(name, device="cpu", num_blocks=64)
    hf = causal_lm(llm.model, llm.weights)
    ids = tokens(15, seed=1)
    expected = hf_logits(hf, ids)
    alloc = llm.manager.add_sequence(9, ids[:9])
    (got,) = forward.prefill(llm.model, llm.weights, llm.caches, [alloc],
                             [torch.tensor(ids[:9])], llm.rope)
    torch.testing.assert_close(got, expected[8], rtol=1e-4, atol=1e-4)
    seq = alloc.seq_id
    for pos in range(9, 15):
        llm.manager.append(seq, 1, [ids[pos]])
        slot = torch.tensor(llm.manager.slot_mapping(seq, pos, pos + 1))
        got = forward.decode_step(llm.model, llm.weights, llm.caches, [], slot,
                                  torch.tensor([ids[pos]]), torch.tensor([pos]),
                                  llm.runner.attend([seq]), llm.rope)
        torch.testing.assert_close(got[0], expected[pos], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_kernels_before_each_gemm_prefetch_its_weight(name, batch, monkeypatch):
    """With ahead_bytes, the layer_ops kernels stood in for on the CPU (each takes any tensor
    here). At most LINEAR_ROWS rows each linear prefetches the next one's weight: QKV -> W_O
    -> gate_up (OPT: fc1) -> W_down -> the next layer's QKV, the last W_down the LM head's,
    which prefetches nothing; the norms none, and the MLP and final RMSNorms are folded into
    the linears after them (the attention norm joins the QKV linear only with RoPE's kernel,
    which needs a GPU: test_llm_gpu). Above it the RMSNorms (not OPT's LayerNorm)
    prefetch the GEMM after them: the attention norm QKV's, the MLP norm gate_up's, the final
    norm the LM head's. Without it nothing prefetches. With kv_ahead (alone), each layer's QKV
    linear, and no other, prefetches that layer's K/V blocks."""
    from kvlab.kernels.layer_ops import LINEAR_ROWS
    from kvlab.model import layer, norm

    llm = kvlab.LLM(name, device="cpu", num_blocks=64)
    w, calls, kv_calls, folded = llm.weights, [], [], []
    ops = layer.layer_ops  # every other op keeps to torch

    def linear(x, weight, bias=None, *, residual=None, swiglu=False, norm=None, ahead=None,
               ahead_bytes=0, kv_ahead=None):
        if norm is not None:  # the norm folded into the linear: no kernel of its own
            folded.append(norm.weight)
            x = torch.nn.functional.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
        calls.append(("linear", weight, ahead, ahead_bytes))
        kv_calls.append((weight, kv_ahead))
        y = torch.nn.functional.linear(x, weight, bias)
        return layer.silu_mul(y) if swiglu else y if residual is None else residual + y

    def rms_norm(x, weight, eps, residual=None, *, ahead=None, ahead_bytes=0):
        calls.append(("norm", weight, ahead, ahead_bytes))
        total = x if residual is None else x + residual
        return torch.nn.functional.rms_norm(total, weight.shape, weight, eps), total

    monkeypatch.setattr(ops, "_cupy_present", lambda: False)
    def linear_problem(x, *args, norm=None, **kwargs):
        # every linear stands in for layer_ops' (so that each one's prefetch is seen), but a
        # norm is folded into one only where the engine's GPU step folds it
        return None if norm is None or x.shape[0] <= LINEAR_ROWS else "rows"

    monkeypatch.setattr(ops, "linear_problem", linear_problem)
    monkeypatch.setattr(ops, "linear", linear)
    monkeypatch.setattr(ops, "rms_norm", rms_norm)
    monkeypatch.setattr(norm, "_norm_kernel", lambda *tensors: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    seqs = [llm.manager.add_sequence(4, [1, 2, 3, i]).seq_id for i in range(batch)]
    for seq in seqs:
        llm.manager.append(seq, 1, [5])
    slots = torch.tensor([llm.manager.slot_mapping(seq, 4, 5)[0] for seq in seqs])

    def step(ahead_bytes, kv_ahead=None):
        calls.clear()
        kv_calls.clear()
        folded.clear()
        forward.decode_step(llm.model, w, llm.caches, [], slots, torch.tensor([5] * batch),
                            torch.tensor([4] * batch), llm.runner.attend(seqs), llm.rope,
                            ahead_bytes=ahead_bytes, kv_ahead=kv_ahead)
        return [(kind, weight, ahead) for kind, weight, ahead, nbytes in calls
                if nbytes == (0 if ahead is None else ahead_bytes)]

    assert all(ahead is None for _, _, ahead in step(0))
    got = step(4096)
    assert len(got) == len(calls)  # a tensor ahead always with its 4096 bytes, none with 0
    linears = [(weight, ahead) for kind, weight, ahead in got if kind == "linear"]
    chain = [t for layer_w, fused in zip(w.layers, w.fused, strict=True) for t in (
        fused.qkv, layer_w.attn.w_o, layer_w.w_up if fused.gate_up is None else fused.gate_up,
        layer_w.w_down)] + [w.lm_head]
    assert [id(weight) for weight, _ in linears] == [id(t) for t in chain]
    assert [id(ahead) for _, ahead in linears[:-1]] == [id(t) for t in chain[1:]]
    assert linears[-1][1] is None  # the LM head: the step's last linear
    norms = [(id(weight), id(ahead)) for kind, weight, ahead in got if kind == "norm"]
    if llm.model.norm == "layernorm":
        assert norms == []  # torch's LayerNorm: no kernel of kvlab's
    elif batch <= LINEAR_ROWS:  # the MLP and final norms folded into the linears after them
        assert norms == [(id(layer_w.attn.norm_weight), id(None)) for layer_w in w.layers]
        assert [id(t) for t in folded] == [id(layer_w.mlp_norm_weight) for layer_w in w.layers
                                           ] + [id(w.norm_weight)]
    else:
        assert norms == [(id(a), id(b)) for layer_w, fused in zip(w.layers, w.fused,
                                                                  strict=True)
                         for a, b in ((layer_w.attn.norm_weight, fused.qkv),
                                      (layer_w.mlp_norm_weight, fused.gate_up))] + [
            (id(w.norm_weight), id(w.lm_head))]
    assert all(kv is None for _, kv in kv_calls)
    tables = torch.zeros(batch, 2, dtype=torch.int32)
    got = step(0, KvAhead(1 << 20, tables, torch.full((batch,), 5, dtype=torch.int32)))
    assert all(ahead is None for _, _, ahead in got)  # ahead_bytes 0: no weight prefetched
    with_kv = [(weight, kv) for weight, kv in kv_calls if kv is not None]
    assert [id(weight) for weight, _ in with_kv] == [id(fused.qkv) for fused in w.fused]
    assert [(id(kv.k_cache), id(kv.v_cache)) for _, kv in with_kv] == [
        (id(cache.k_cache), id(cache.v_cache)) for cache in llm.caches]
    assert all(kv.block_tables is tables and kv.nbytes == 1 << 20 for _, kv in with_kv)
    with pytest.raises(ValueError, match="kv_ahead: block_tables .* must be int32"):
        step(0, KvAhead(1 << 20, tables.long(), torch.full((batch,), 5, dtype=torch.int32)))
    assert calls == []  # refused before the step's first kernel


def test_a_weight_the_kernels_cannot_prefetch_is_left_out_of_the_hint():
    from kvlab.model.layer import prefetch_args

    weight = torch.zeros(8, 16)
    assert prefetch_args(64, weight) == {"ahead": weight, "ahead_bytes": 64}
    assert prefetch_args(0, weight) == prefetch_args(64, None) == {}
    assert prefetch_args(64, weight[:, ::2]) == {}  # not contiguous
    assert prefetch_args(64, weight.view(-1)[1:]) == {}  # not 16-byte aligned


def test_swiglu_on_torch_hands_the_prefetch_to_its_product_kernel(monkeypatch):
    """A step of more rows than layer_ops' linear takes: F.linear, then SwiGLU's product as one
    kernel, which prefetches W_down's first bytes (stood in for on the CPU)."""
    from kvlab.model import layer

    got = []

    def silu_mul(gate_up, *, ahead=None, ahead_bytes=0):
        got.append((ahead, ahead_bytes))
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    monkeypatch.setattr(layer.layer_ops, "usable", lambda *tensors: True)
    monkeypatch.setattr(layer.layer_ops, "silu_mul", silu_mul)
    w_down = torch.randn(16, 8)
    y = layer.linear(torch.randn(3, 16), torch.randn(16, 16), swiglu=True, ahead=w_down,
                     ahead_bytes=256)
    assert y.shape == (3, 8) and len(got) == 1
    assert got[0][0] is w_down and got[0][1] == 256


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_tokens_equal_hf_generate(name):
    llm = kvlab.LLM(name, device="cpu", num_blocks=64)
    hf = causal_lm(llm.model, llm.weights)
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    prompt = tokens(11, seed=2)
    out = llm.generate(prompt, max_new_tokens=32)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)
    assert out.tokens == [ref[0, len(prompt):].tolist()]
    assert out.finish_reasons == ["length"] and len(out.step_ms) == 31
    assert out.step_batch == [1] * 31 and out.decode_tokens_per_s > 0


def test_a_batch_gives_the_tokens_of_its_requests_run_alone():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64)
    prompts = [tokens(n, seed=n) for n in (3, 17, 40)]
    batch = llm.generate(prompts, max_new_tokens=12)
    assert batch.tokens == [llm.generate(p, max_new_tokens=12).tokens[0] for p in prompts]
    assert batch.step_batch == [3] * 11
    assert llm.manager.num_free_blocks == 64  # every request's blocks came back


def test_prompts_with_a_common_prefix_share_its_blocks_and_decode_alike():
    llm = kvlab.LLM("tiny-qwen", device="cpu", num_blocks=64, block_size=16)
    prefix = tokens(40, seed=5)  # two whole blocks of 16 are shared
    prompts = [prefix + tokens(5, seed=6), prefix + tokens(9, seed=7)]
    first, second = (make_requests([p], 1, llm.model)[0] for p in prompts)
    for r in (first, second):
        llm.scheduler.place(r)
    llm.runner.prefill([first, second])  # one pass: the second's shared blocks are not rewritten
    tables = [llm.manager.block_table(r.seq_id) for r in (first, second)]
    assert tables[0][:2] == tables[1][:2] and tables[0][2] != tables[1][2]
    for r in (first, second):
        llm.manager.free(r.seq_id)
    shared = llm.generate(prompts, max_new_tokens=10)
    assert shared.tokens == [llm.generate(p, max_new_tokens=10).tokens[0] for p in prompts]


@pytest.mark.parametrize("name", FAMILIES)
def test_a_batched_prefill_gives_each_prompt_its_own_logits(name):
    """Prompts of 1, 9 and 23 tokens in one pass (the GEMMs over all 33 tokens, attention causal
    within each prompt): the logits and cache of each prompt prefilled alone."""
    llm = kvlab.LLM(name, device="cpu", num_blocks=64, block_size=8)
    prompts = [tokens(n, seed=20 + n) for n in (1, 9, 23)]
    allocs = [llm.manager.add_sequence(len(p), p) for p in prompts]
    together = forward.prefill(llm.model, llm.weights, llm.caches, allocs,
                               [torch.tensor(p) for p in prompts], llm.rope)
    cached = [llm.caches[-1].gather(a.seq_id) for a in allocs]
    for a in allocs:
        llm.manager.free(a.seq_id)
    for i, p in enumerate(prompts):
        alloc = llm.manager.add_sequence(len(p), p)
        (alone,) = forward.prefill(llm.model, llm.weights, llm.caches, [alloc],
                                   [torch.tensor(p)], llm.rope)
        torch.testing.assert_close(together[i], alone, rtol=1e-5, atol=1e-5)
        for got, want in zip(cached[i], llm.caches[-1].gather(alloc.seq_id), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        llm.manager.free(alloc.seq_id)


def test_prefill_passes_take_at_most_max_prefill_tokens(monkeypatch):
    """Requests admitted together share a prefill pass up to max_prefill_tokens tokens, in
    order; a longer prompt runs alone; the tokens are those of prompts run one at a time."""
    passes = []
    prefill = forward.prefill

    def recording(model, w, caches, allocs, prompts, *args):
        passes.append([p.shape[0] for p in prompts])
        return prefill(model, w, caches, allocs, prompts, *args)

    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64, max_prefill_tokens=50)
    prompts = [tokens(n, seed=30 + i) for i, n in enumerate((20, 25, 10, 60, 5, 5))]
    alone = [llm.generate(p, max_new_tokens=4).tokens[0] for p in prompts]
    monkeypatch.setattr(forward, "prefill", recording)
    assert llm.generate(prompts, max_new_tokens=4).tokens == alone
    assert passes == [[20, 25], [10], [60], [5, 5]]
    assert llm.with_attention("reference").max_prefill_tokens == 50


def test_requests_wait_for_blocks_and_join_as_others_finish():
    """8 blocks of 16 tokens; a request of 40 + 20 tokens ends in 4: two run at a time, the others
    join as blocks come back, and every request gets the tokens it gets alone."""
    llm = kvlab.LLM("tiny-opt", device="cpu", num_blocks=8, block_size=16)
    prompts = [tokens(40, seed=10 + i) for i in range(5)]
    alone = [llm.generate(p, max_new_tokens=20).tokens[0] for p in prompts]
    batched = llm.generate(prompts, max_new_tokens=20)
    assert batched.tokens == alone and max(batched.step_batch) == 2
    assert llm.manager.num_free_blocks == 8


def test_a_full_cache_preempts_and_recomputes_instead_of_failing():
    """30-token prompts fit two blocks each, so three are admitted into 8 blocks; grown to 60
    tokens they need 12: the latest admitted give their blocks back and are recomputed later,
    with the tokens they would have had alone."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, block_size=16)
    prompts = [tokens(30, seed=20 + i) for i in range(4)]
    alone = [llm.generate(p, max_new_tokens=30).tokens[0] for p in prompts]
    squeezed = llm.generate(prompts, max_new_tokens=30)
    assert squeezed.preemptions > 0 and max(squeezed.step_batch) == 3
    assert squeezed.tokens == alone and squeezed.finish_reasons == ["length"] * 4
    assert llm.manager.num_free_blocks == 8 and not llm.manager.seq_ids


def test_requests_arrive_when_told_and_stop_at_their_own_limits():
    """A serving run: the second request arrives 0.3 s after the call and is not admitted
    before; each request stops at its own max_new_tokens, with the tokens it gets alone."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64)
    prompts = [tokens(20, seed=30), tokens(9, seed=31)]
    out = llm.generate(prompts, [12, 5], arrivals=[0.0, 0.3])
    assert [len(t) for t in out.tokens] == [12, 5]
    alone = [llm.generate(p, n).tokens[0] for p, n in zip(prompts, [12, 5], strict=True)]
    assert out.tokens == alone
    assert out.arrival_s == [0.0, 0.3] and out.first_token_s[1] >= 0.3
    assert out.first_token_s[0] < 0.3 and all(
        f >= t for f, t in zip(out.finish_s, out.first_token_s, strict=True))


def test_sampling_is_seeded_and_top_p_near_zero_is_greedy():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=32)
    prompt = tokens(8, seed=3)
    hot = [llm.generate(prompt, 16, temperature=1.0, seed=4).tokens for _ in range(2)]
    assert hot[0] == hot[1] != llm.generate(prompt, 16, temperature=1.0, seed=5).tokens
    greedy = llm.generate(prompt, 16).tokens
    assert llm.generate(prompt, 16, temperature=0.7, top_p=1e-6, seed=9).tokens == greedy


def test_eos_ends_a_request_unless_ignored():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=32)
    prompt = tokens(8, seed=3)
    greedy = llm.generate(prompt, 8).tokens[0]
    eos = greedy[2]
    stopped = llm.generate(prompt, 8, eos_token_id=eos)
    assert stopped.tokens[0] == greedy[:greedy.index(eos) + 1]
    assert stopped.finish_reasons == ["eos"]
    assert llm.generate(prompt, 8, eos_token_id=eos, ignore_eos=True).tokens[0] == greedy


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_p": 0.9}])
def test_async_decode_gives_the_steps_and_tokens_of_synchronous_decode(monkeypatch, sampling):
    """Steps queued one ahead (async_decode; here on the CPU, where it runs the same schedule):
    the tokens of waiting for each step's tokens, through EOS in the middle of a batch, requests
    of different limits ending, waiting for blocks and preemption. Most steps are queued ahead;
    the others wait. Without EOS the steps are the same, and sampling draws alike; a request
    that ends by EOS has a row in the step queued after it (dropped), and nothing joins before
    that step's tokens are in, so a waiting request may join a step later."""
    prompts = [tokens(30, seed=40 + i) for i in range(4)]
    limits = [30, 7, 25, 30]
    sync = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, block_size=16)
    ahead = kvlab.LLM("tiny-llama", device="cpu", num_blocks=8, block_size=16,
                      async_decode=True, weights=sync.weights)
    assert not sync.async_decode and ahead.with_attention("reference").async_decode
    assert not ahead.with_attention("reference", async_decode=False).async_decode
    greedy = sync.generate(prompts[0], 30).tokens[0]
    eos = None if sampling else next(t for t in greedy[8:] if t not in greedy[:8])
    queued = []
    launch = ahead._launch

    def recording(rows, token_ids, *args):
        queued.append(not isinstance(token_ids, list))  # the previous step's tokens, on device
        return launch(rows, token_ids, *args)

    monkeypatch.setattr(ahead, "_launch", recording)
    want, got = (llm.generate(prompts, limits, eos_token_id=eos, seed=1, **sampling)
                 for llm in (sync, ahead))
    assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
    assert len(got.step_ms) == len(got.step_batch) and got.preemptions > 0
    # every token but each request's first (its prefill's) came from a decode step's live row
    assert sum(got.step_batch) == sum(len(t) - 1 for t in got.tokens)
    if sampling:
        assert got.step_batch == want.step_batch and got.preemptions == want.preemptions
    else:
        assert "eos" in got.finish_reasons
    assert len(queued) == len(got.step_ms) and len(queued) / 2 < sum(queued) < len(queued)
    assert ahead.manager.num_free_blocks == 8 and not ahead.manager.seq_ids


@pytest.mark.parametrize("async_decode", [False, True])
def test_a_steps_time_runs_from_the_tokens_before_it_to_its_own(monkeypatch, async_decode):
    """The host's work before a step launched after the last step's tokens (here make_room,
    slowed by 300 ms) counts in that step, waited for or not: a step's time runs from the last
    step's tokens on the host, not from its launch. The first step, after the prefill, runs
    from its launch."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64, async_decode=async_decode)
    make_room, slowed = llm.scheduler.make_room, []

    def slow_make_room():
        slowed.append(True)
        time.sleep(0.3)
        return make_room()

    monkeypatch.setattr(llm.scheduler, "make_room", slow_make_room)
    # two requests ending apart: with async decode, the step after the first one's end is not
    # queued ahead, and the host makes room before it
    out = llm.generate([tokens(9, seed=3), tokens(5, seed=4)], [3, 6])
    assert len(out.step_ms) == 5 and len(slowed) == (2 if async_decode else 5)
    assert sum(ms >= 300 for ms in out.step_ms) == len(slowed) - 1, out.step_ms
    if not async_decode:  # (on the CPU a step queued ahead computes as it is launched, in the
        assert out.step_ms[0] < 300, out.step_ms  # time of the step before it)


def test_async_decode_waits_for_the_step_queued_after_an_eos(monkeypatch):
    """EOS with nothing waiting: the step queued ahead keeps the ended request's row (dropped),
    the next step is waited for, and a lone request ending by EOS leaves a step of dropped rows
    only, which is still waited for and counted with no tokens. Every step launched is in
    step_ms."""
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64, async_decode=True)
    sync = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64, weights=llm.weights)
    prompts = [tokens(n, seed=50 + n) for n in (6, 13, 27)]
    greedy = sync.generate(prompts[1], 20).tokens[0]
    eos = next(t for t in greedy[5:] if t not in greedy[:5])
    launched = []
    launch = llm._launch

    def counting(*args):
        launched.append(args[1])
        return launch(*args)

    monkeypatch.setattr(llm, "_launch", counting)
    for batch in (prompts, prompts[1:2]):
        launched.clear()
        want, got = (e.generate(batch, 20, eos_token_id=eos) for e in (sync, llm))
        assert got.tokens == want.tokens and "eos" in got.finish_reasons
        assert len(launched) == len(got.step_ms) == len(got.step_batch)
        assert sum(got.step_batch) == sum(len(t) - 1 for t in got.tokens)
        assert llm.manager.num_free_blocks == 64 and not llm.manager.seq_ids
    assert got.step_batch == want.step_batch + [0]  # the lone request's last step: its row dropped


@pytest.mark.parametrize(("make", "message"), [
    (lambda: kvlab.LLM("gpt-5", device="cpu"),
     "model='gpt-5': must be a ModelConfig, a checkpoint folder"),
    (lambda: kvlab.LLM(device="cpu", attention="flash"), "attention='flash': must be one of"),
    (lambda: kvlab.LLM(device="cpu", attention="gqa"), "the CUDA kernels need device='cuda'"),
    (lambda: kvlab.LLM(device="cpu", dtype=torch.float64), "dtype=torch.float64: must be"),
    (lambda: kvlab.LLM(device="cpu", num_blocks=0), "num_blocks=0: must be an integer >= 1"),
    (lambda: kvlab.LLM(device="cpu", block_size=24), "block_size"),
    (lambda: kvlab.LLM(device="cpu", prefetch=kvlab.PrefetchConfig("bulk")),
     "must be None, or a PrefetchConfig with a CUDA kernel"),
    (lambda: kvlab.LLM(device="cpu", cuda_graphs=True), "cuda_graphs=True: must be a bool, "
     "and False with attention='reference'"),
    (lambda: kvlab.LLM(device="cpu", graph_max_len=0), "graph_max_len=0: must be an integer"),
    (lambda: kvlab.LLM(device="cpu", max_prefill_tokens=0),
     "max_prefill_tokens=0: must be an integer >= 1"),
    (lambda: kvlab.LLM(device="cpu", async_decode=1), "async_decode=1: must be None or a bool"),
    (lambda: kvlab.LLM(device="cpu", ahead_bytes=-1),
     "ahead_bytes=-1: must be an integer in .0, 1073741824."),
    (lambda: kvlab.LLM(device="cpu", ahead_bytes=2.5e6),
     "ahead_bytes=2500000.0: must be an integer in .0, 1073741824."),
    (lambda: kvlab.LLM(device="cpu", ahead_bytes=True),
     "ahead_bytes=True: must be an integer in .0, 1073741824."),
    (lambda: kvlab.LLM(device="cpu", ahead_bytes=1 << 20),
     "ahead_bytes=1048576: the cross-kernel prefetch runs in the kernels of a GPU step in fp16 "
     "or bf16; needs a CUDA attention (here 'reference' on cpu), or 0"),
    (lambda: kvlab.LLM(device="cpu", num_blocks=8).with_attention("reference", ahead_bytes=64),
     "ahead_bytes=64: the cross-kernel prefetch runs in the kernels of a GPU step"),
    (lambda: kvlab.LLM(device="cpu", ahead_kv_bytes=-1),
     "ahead_kv_bytes=-1: must be an integer in .0, 1073741824."),
    (lambda: kvlab.LLM(device="cpu", ahead_kv_bytes=1 << 20),
     "ahead_kv_bytes=1048576: the cross-kernel prefetch runs in the kernels of a GPU step"),
    (lambda: kvlab.LLM(device="cpu", num_blocks=8).with_attention("reference",
                                                                  ahead_kv_bytes=64),
     "ahead_kv_bytes=64: the cross-kernel prefetch runs in the kernels of a GPU step"),
    (lambda: kvlab.LLM(device="cpu", weights="llama.safetensors"),
     "weights=str: must be None, or a ModelWeights with a preset name or a ModelConfig"),
    (lambda: kvlab.LLM("tiny-opt", device="cpu", weights=seeded_weights("tiny-llama")),
     "weights.positions: None, must be (514, 256) for tiny-opt"),
    (lambda: kvlab.LLM(device="cpu", dtype=torch.float16, weights=seeded_weights("tiny-llama")),
     "weights: torch.float32 on cpu, must be dtype=torch.float16 on device=cpu"),
    (lambda: kvlab.LLM(device="cpu", num_blocks=8).with_attention("gqa"),
     "attention='gqa': the CUDA kernels need device='cuda'"),
    (lambda: kvlab.LLM(device="cpu", num_blocks=8).with_attention("reference",
                                                                  async_decode="no"),
     "async_decode='no': must be"),
])
def test_bad_engine_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(").replace(")", "\\)")):
        make()


def seeded_weights(name: str) -> ModelWeights:
    return ModelWeights.random(MODELS[name], seed=0)


def weight_tensors(w: ModelWeights) -> list[torch.Tensor]:
    return [w.embed, w.norm_weight, w.lm_head,
            *(t for layer in w.layers for t in named_tensors(layer).values())]


def test_with_attention_runs_the_same_weight_tensors_on_a_cache_of_its_own():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64, block_size=8, seed=3)
    twin = llm.with_attention("reference")
    assert [t.data_ptr() for t in weight_tensors(twin.weights)] == [
        t.data_ptr() for t in weight_tensors(llm.weights)]
    assert twin.manager is not llm.manager
    assert twin.caches[0].k_cache.data_ptr() != llm.caches[0].k_cache.data_ptr()
    assert (twin.model, twin.dtype, twin.device, twin.seed, twin.block_size,
            twin.manager.num_blocks) == (llm.model, llm.dtype, llm.device, 3, 8, 64)
    prompts = [tokens(n, seed=n) for n in (3, 17, 40)]
    assert twin.generate(prompts, 12).tokens == llm.generate(prompts, 12).tokens


def test_with_attention_can_share_the_cache_of_its_layout():
    llm = kvlab.LLM("tiny-llama", device="cpu", num_blocks=64)
    twin = llm.with_attention("reference", share_cache=True)
    assert twin.manager is llm.manager and twin.caches is llm.caches
    assert twin.usable_blocks == llm.usable_blocks == 64
    prompts = [tokens(n, seed=n) for n in (3, 17, 40)]
    assert twin.generate(prompts, 12).tokens == llm.generate(prompts, 12).tokens
    assert llm.manager.num_free_blocks == 64  # each generate leaves the cache empty
    with pytest.raises(ValueError, match="share_cache=True: attention='vllm_v1' does not read "
                                         "this LLM's 'hnd' cache layout"):
        llm.with_attention("vllm_v1", share_cache=True)
    with pytest.raises(ValueError, match="share_cache=1: must be a bool"):
        llm.with_attention("reference", share_cache=1)


@pytest.fixture(scope="module")
def small():
    return kvlab.LLM("tiny-llama", device="cpu", num_blocks=4, block_size=16)


@pytest.mark.parametrize(("prompts", "kwargs", "message"), [
    ("hello", {}, "kvlab has no tokenizer; pass token ids"),
    ([], {}, "must be a non-empty list of token-id lists"),
    ([[1, 2], []], {}, "prompts\\[1\\]: must be a non-empty list of token ids"),
    ([[1, 5000]], {}, "prompts\\[0\\]: token 5000 is not an id in \\[0, 1024\\)"),
    ([[1, 2.0]], {}, "token 2.0 is not an id"),
    ([[1] * 500], {"max_new_tokens": 20}, "exceed tiny-llama's context limit of 512 tokens"),
    ([[1, 2]], {"max_new_tokens": 0}, "max_new_tokens=0: must be an integer >= 1"),
    ([[1] * 60], {"max_new_tokens": 10},
     "70 tokens need 5 blocks; the cache has 4 for requests \\(num_blocks=4\\)"),
    ([[1, 2]], {"temperature": -1.0}, "temperature=-1.0: must be a finite number >= 0"),
    ([[1, 2]], {"top_p": 0}, "top_p=0: must be a number in \\(0, 1\\]"),
    ([[1, 2]], {"eos_token_id": 2000}, "eos_token_id=2000: must be None or a token id"),
    ([[1, 2], [3]], {"max_new_tokens": [4]}, "max_new_tokens: 1 limits for 2 prompts"),
    ([[1, 2], [3]], {"max_new_tokens": [4, 0]}, "max_new_tokens\\[1\\]=0: must be an integer"),
    ([[1, 2]], {"arrivals": [-1.0]}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
    ([[1, 2]], {"arrivals": [0.0, 1.0]}, "arrivals: must be 1 numbers in \\[0, 86,400\\]"),
])
def test_bad_requests_are_refused_before_anything_runs(small, prompts, kwargs, message):
    with pytest.raises(ValueError, match=message):
        small.generate(prompts, **kwargs)
    assert small.manager.num_free_blocks == 4 and not small.manager.seq_ids


def test_llm_is_exported_lazily_and_reads_its_preset():
    llm = kvlab.LLM(MODELS["tiny-qwen"], device="cpu", num_blocks=8)
    assert llm.attention == "reference" and llm.dtype == torch.float32
    assert "LLM('tiny-qwen', attention='reference'" in repr(llm)
    assert len(llm.caches) == MODELS["tiny-qwen"].num_layers
    assert all(c.manager is llm.manager for c in llm.caches)
