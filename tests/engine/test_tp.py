"""Tensor parallelism (kvlab.engine.tp) on the CPU: two gloo processes compute what one does."""

import dataclasses
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kvlab
from kvlab.config import MODELS
from kvlab.engine import forward, tp

PROMPT = [(37 * i + 11) % 1000 for i in range(21)]
FED = [5, 900, 17, 256, 3, 3]  # decode steps fed these tokens


def forced_logits(llm) -> torch.Tensor:
    """fp32 logits [7, vocab]: PROMPT's prefill, then a decode step per token of FED."""
    alloc = llm.manager.add_sequence(len(PROMPT), PROMPT)
    seq = alloc.seq_id
    rows = [forward.prefill(llm.local, llm.weights, llm.caches, alloc, torch.tensor(PROMPT),
                            llm.rope, llm._reduce)]
    for token in FED:
        position = llm.manager.seq_len(seq)
        llm.manager.append(seq, 1, [token])
        slot = torch.tensor(llm.manager.slot_mapping(seq, position, position + 1))
        rows.append(forward.decode_step(
            llm.local, llm.weights, llm.caches, [], slot, torch.tensor([token]),
            torch.tensor([position]), llm._attend([seq]), llm.rope, llm._reduce)[0])
    llm.manager.free(seq)
    return torch.stack(rows)


def run(name: str, tensor_parallel: bool) -> dict:
    llm = kvlab.LLM(name, device="cpu", num_blocks=64, tensor_parallel=tensor_parallel)
    prompts = [PROMPT, PROMPT[:9], [4] * 40]
    return {"logits": forced_logits(llm), "local": llm.local,
            "tokens": llm.generate(prompts, max_new_tokens=24).tokens,
            "sampled": llm.generate(prompts, max_new_tokens=8, temperature=1.0).tokens}


def rank_main(rank: int, world: int, port: int, name: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.save(run(name, tensor_parallel=True), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen", "tiny-opt"])
def test_two_ranks_compute_the_logits_and_tokens_of_one(name, tmp_path, monkeypatch):
    out = str(tmp_path / "rank")
    # the spawned interpreters import rank_main from this file: the checkout must be on their path
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    mp.spawn(rank_main, args=(2, free_port(), name, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    alone = run(name, tensor_parallel=False)
    m = MODELS[name]
    assert ranks[0]["local"].num_qo_heads == m.num_qo_heads // 2
    assert ranks[0]["local"].intermediate_size == m.intermediate_size // 2
    for r in ranks:
        torch.testing.assert_close(r["logits"], alone["logits"], rtol=1e-5, atol=1e-5)
        assert r["tokens"] == alone["tokens"]
    assert ranks[0]["sampled"] == ranks[1]["sampled"]  # the same logits, the same draws


def test_a_shard_must_divide_the_heads_and_the_mlp():
    with pytest.raises(ValueError, match="tiny-qwen's num_kv_heads=2 does not divide by 4"):
        tp.shard_config(MODELS["tiny-qwen"], 4)
    odd = dataclasses.replace(MODELS["tiny-llama"], intermediate_size=513)
    with pytest.raises(ValueError, match="tiny-llama's intermediate_size=513 does not divide "
                                         "by 2"):
        tp.shard_config(odd, 2)


def test_tensor_parallel_needs_a_process_group():
    with pytest.raises(ValueError, match="tensor_parallel=True: needs an initialised "
                                         "torch.distributed process group"):
        kvlab.LLM("tiny-llama", device="cpu", tensor_parallel=True)
    with pytest.raises(ValueError, match="tensor_parallel=2: must be a bool"):
        kvlab.LLM("tiny-llama", device="cpu", tensor_parallel=2)
