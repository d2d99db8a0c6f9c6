"""Tensor parallelism (kvlab.engine.tp) on the CPU: two gloo processes compute what one does."""

import dataclasses
import socket

import pytest
import torch
import torch.multiprocessing as mp
from tp_ranks import rank_main, run

import kvlab
from kvlab.config import MODELS
from kvlab.engine import tp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen", "tiny-opt"])
def test_two_ranks_compute_the_logits_and_tokens_of_one(name, tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(rank_main, args=(2, free_port(), name, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    alone = run(name, tensor_parallel=False)
    m = MODELS[name]
    assert ranks[0]["local"].num_qo_heads == m.num_qo_heads // 2
    assert ranks[0]["local"].intermediate_size == m.intermediate_size // 2
    for r in ranks:
        torch.testing.assert_close(r["logits"], alone["logits"], rtol=1e-5, atol=1e-5)
        assert r["tokens"] == r["ahead"] == alone["tokens"]  # async_decode too
        assert r["arrivals"].startswith("arrivals: with tensor_parallel=True every rank")
    assert "arrivals" not in alone  # one process serves arrivals
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
