"""kvlab.engine on a GPU: the CUDA decode kernels give the reference attention's tokens, and a
real-size model runs (seeded random weights)."""

import pytest
import torch

import kvlab

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen", "tiny-opt"])
@pytest.mark.parametrize("attention", ["vllm_v1", "gqa"])
def test_kernels_decode_the_reference_tokens(name, attention):
    prompts = [torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (5, 33, 70)]
    runs = {a: kvlab.LLM(name, attention=a, device="cuda", dtype=torch.float16, num_blocks=64,
                         cuda_graphs=False)
            .generate(prompts, max_new_tokens=16) for a in ("reference", attention)}
    assert runs[attention].tokens == runs["reference"].tokens
    assert runs[attention].attention == attention


def test_a_real_size_model_decodes_a_batch():
    llm = kvlab.LLM("llama3-8b", attention="auto", device="cuda", num_blocks=512)
    out = llm.generate([[1] * 100, [2] * 300], max_new_tokens=8)
    assert [len(t) for t in out.tokens] == [8, 8] and out.step_batch == [2] * 7
    assert all(ms > 0 for ms in out.step_ms)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-opt"])
@pytest.mark.parametrize("attention", ["vllm_v1", "gqa"])
def test_cuda_graphs_decode_the_eager_tokens(name, attention):
    """A small cache makes requests wait, join and be preempted, so the batch changes size
    from step to step (graph buckets 1, 2 and 4); the graphs give the eager steps' tokens."""
    prompts = [torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (5, 33, 70, 18)]
    runs = {}
    for graphs in (False, True):
        llm = kvlab.LLM(name, attention=attention, device="cuda", num_blocks=16,
                        cuda_graphs=graphs)
        runs[graphs] = llm.generate(prompts, max_new_tokens=40)
        if graphs:
            assert len(llm.graphs.captured) >= 2
    assert runs[True].tokens == runs[False].tokens
    assert len(set(runs[True].step_batch)) > 1
