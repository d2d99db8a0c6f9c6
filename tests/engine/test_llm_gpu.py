"""kvlab.engine on a GPU: the CUDA decode kernels give the reference attention's tokens, and a
real-size model runs (seeded random weights)."""

import pytest
import torch

import kvlab
from kvlab.engine import graphs as engine_graphs

pytestmark = pytest.mark.gpu


def forced_logits(llm, prompts, fed):
    """Logits [steps + 1, batch, vocab] of llm's model, in fp32: the prefill's last token of each
    prompt, then decode steps of the whole batch fed fed[step][i] (llm's attention)."""
    from kvlab.engine import forward

    seqs, rows = [], []
    for prompt in prompts:
        alloc = llm.manager.add_sequence(len(prompt), prompt)
        seqs.append(alloc.seq_id)
        rows.append(forward.prefill(llm.model, llm.weights, llm.caches, [alloc],
                                    [torch.tensor(prompt, device="cuda")], llm.rope)[0])
    steps = [torch.stack(rows)]
    for tokens in fed:
        positions = [llm.manager.seq_len(s) for s in seqs]
        for seq, token in zip(seqs, tokens, strict=True):
            llm.manager.append(seq, 1, [token])
        slots = [llm.manager.slot_mapping(s, p, p + 1)[0]
                 for s, p in zip(seqs, positions, strict=True)]
        steps.append(forward.decode_step(
            llm.model, llm.weights, llm.caches, [], torch.tensor(slots, device="cuda"),
            torch.tensor(tokens, device="cuda"), torch.tensor(positions, device="cuda"),
            llm.runner.attend(seqs), llm.rope))
    for seq in seqs:
        llm.manager.free(seq)
    return torch.stack(steps).float()


def check_tokens(tokens, expected, logits, tolerance):
    """tokens[i] equal expected[i], unless they part at a step where expected's two best
    logits (logits[step, i], from the run that chose `expected`) are within `tolerance`: a
    tie that rounding may break either way."""
    for i, (got, want) in enumerate(zip(tokens, expected, strict=True)):
        parted = next((s for s, (a, b) in enumerate(zip(got, want, strict=True)) if a != b),
                      None)
        if parted is not None:
            top2 = logits[parted, i].topk(2).values
            assert top2[0] - top2[1] < tolerance, f"request {i} parts at step {parted}"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen", "tiny-opt"])
@pytest.mark.parametrize("attention", ["vllm_v1", "gqa"])
def test_kernels_decode_the_reference_tokens(name, attention):
    """fp16: the kernels' logits equal the fp32 reference attention's, step by step fed the
    same tokens, and their greedy tokens are the reference's (but at near ties)."""
    prompts = [torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (5, 33, 70)]
    tolerance = 2e-2
    llms = {a: kvlab.LLM(name, attention=a, device="cuda", dtype=torch.float16, num_blocks=64,
                         cuda_graphs=False) for a in ("reference", attention)}
    runs = {a: llm.generate(prompts, max_new_tokens=16) for a, llm in llms.items()}
    fed = list(zip(*(t[:-1] for t in runs["reference"].tokens), strict=True))
    logits = {a: forced_logits(llm, prompts, fed) for a, llm in llms.items()}
    assert (logits[attention] - logits["reference"]).abs().max() < tolerance
    check_tokens(runs[attention].tokens, runs["reference"].tokens, logits["reference"],
                 tolerance)
    assert runs[attention].attention == attention


def test_a_real_size_model_decodes_a_batch():
    llm = kvlab.LLM("llama3-8b", attention="auto", device="cuda", num_blocks=512)
    out = llm.generate([[1] * 100, [2] * 300], max_new_tokens=8)
    assert [len(t) for t in out.tokens] == [8, 8] and out.step_batch == [2] * 7
    assert all(ms > 0 for ms in out.step_ms)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_the_cross_kernel_prefetch_leaves_the_tokens_as_they_are(cuda_graphs):
    """ahead_bytes only brings the next linear's weight into L2, ahead_kv_bytes the attention's
    K/V blocks: a real-size model's greedy tokens at batch 1 and 2 (layer_ops' linears) and 3
    (cuBLAS's, which ignore them), eager and in graphs, are those of the same weights without."""
    base = kvlab.LLM("llama3-8b", attention="gqa", device="cuda", num_blocks=256,
                     cuda_graphs=cuda_graphs)
    ahead = base.with_attention("gqa", ahead_bytes=8 << 20, share_cache=True)
    both = base.with_attention("gqa", ahead_bytes=8 << 20, ahead_kv_bytes=4 << 20,
                               share_cache=True)
    assert ahead.ahead_bytes == 8 << 20 and base.ahead_bytes == 0
    assert (both.ahead_kv_bytes, ahead.ahead_kv_bytes) == (4 << 20, 0)
    if cuda_graphs:
        assert ahead.graphs.ahead_bytes == 8 << 20 and both.graphs.ahead_kv_bytes == 4 << 20
    for prompts in ([[1] * 100], [[1] * 100, [2] * 300], [[3] * 50, [4] * 60, [5] * 70]):
        expected = base.generate(prompts, max_new_tokens=12).tokens
        assert ahead.generate(prompts, max_new_tokens=12).tokens == expected
        assert both.generate(prompts, max_new_tokens=12).tokens == expected


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
@pytest.mark.parametrize("attention", ["vllm_v1", "gqa"])
def test_cuda_graphs_decode_the_eager_tokens(name, attention, monkeypatch):
    """A small cache makes requests wait, join and be preempted, so the batch changes size
    from step to step (graph buckets 1, 2 and 4), and spans from 16 tokens make the sequences
    cross from one span's graphs to the next (64 to 128: every batch holds a sequence of 33
    tokens or more); the graphs give the eager steps' tokens, with each step waited for and
    with steps queued one ahead (async_decode, their token ids copied on the GPU). A graph's
    plan is made for its bucket and span, not the step's batch (`kvlab.engine.graphs`), so its
    sums may round otherwise: a request may part from the eager tokens only at a near tie of
    the eager model's two best logits (`check_tokens`)."""
    monkeypatch.setattr(engine_graphs, "MIN_SPAN", 16)
    prompts = [torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (5, 33, 70, 18)]
    runs = {}
    for graphs, ahead in ((False, False), (True, False), (True, True)):
        llm = kvlab.LLM(name, attention=attention, device="cuda", num_blocks=16,
                        cuda_graphs=graphs, async_decode=ahead)
        runs[graphs, ahead] = llm.generate(prompts, max_new_tokens=40)
        if graphs:
            assert len({size for size, _ in llm.graphs.captured}) >= 2
            assert len({span for _, span in llm.graphs.captured}) >= 2
    eager = runs[False, False].tokens
    if runs[True, True].tokens != eager or runs[True, False].tokens != eager:
        llm = kvlab.LLM(name, attention=attention, device="cuda", num_blocks=64,
                        cuda_graphs=False)
        logits = forced_logits(llm, prompts, list(zip(*(t[:-1] for t in eager), strict=True)))
        for graphs in (runs[True, True], runs[True, False]):
            check_tokens(graphs.tokens, eager, logits, tolerance=2e-2)
    assert runs[True, True].step_batch == runs[True, False].step_batch
    assert len(set(runs[True, True].step_batch)) > 1


def test_async_decode_stops_at_eos_with_the_tokens_of_waiting_for_each_step():
    """EOS in the middle of a batch on the graphs: the row of the step queued after it is
    dropped, and the tokens are those of steps waited for."""
    sync = kvlab.LLM("tiny-llama", attention="gqa", device="cuda", num_blocks=64,
                     async_decode=False)
    ahead = kvlab.LLM("tiny-llama", attention="gqa", device="cuda", num_blocks=64,
                      weights=sync.weights)
    assert ahead.async_decode is True
    prompts = [torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (7, 40, 21)]
    greedy = sync.generate(prompts, 24).tokens[1]
    eos = next(t for t in greedy[6:] if t not in greedy[:6])
    want, got = (llm.generate(prompts, 24, eos_token_id=eos) for llm in (sync, ahead))
    assert got.tokens == want.tokens and "eos" in got.finish_reasons
    assert got.finish_reasons == want.finish_reasons
    assert ahead.manager.num_free_blocks == 64 - 1  # all but the graphs' scratch block


@pytest.mark.parametrize("name", ["llama3-8b", "qwen2.5-7b"])
def test_real_size_logits_and_greedy_tokens_match_hf(name):
    """A real-size model (fp16, seeded random weights) against HF's on the same tensors: the
    prefill's and 24 decode steps' logits agree to fp16 tolerance, and 32 greedy tokens are
    HF's, unless they part where HF's two best logits are closer than that tolerance (a tie
    that rounding may break either way)."""
    from kvlab.engine.hf import causal_lm

    tolerance = 0.05  # logits are O(1) (std about 1); fp16 rounding across 28-32 layers
    llm = kvlab.LLM(name, attention="gqa", device="cuda", num_blocks=64, cuda_graphs=False)
    hf = causal_lm(llm.model, llm.weights)
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id = None, 0
    ids = torch.randint(0, llm.model.vocab_size, (120,),
                        generator=torch.Generator().manual_seed(3)).tolist()
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([ids], device="cuda")).logits[0].float()
    got = forced_logits(llm, [ids[:96]], [[t] for t in ids[96:]])[:, 0]  # [25, vocab]
    assert (got - expected[95:]).abs().max() < tolerance

    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids], device="cuda"), max_new_tokens=32,
                          do_sample=False, output_scores=True, return_dict_in_generate=True)
    scores = torch.stack([score.float() for score in ref.scores])  # [steps, 1, vocab]
    check_tokens(llm.generate(ids, max_new_tokens=32).tokens,
                 [ref.sequences[0, len(ids):].tolist()], scores, tolerance)
