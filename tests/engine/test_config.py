"""EngineConfig: the LLM's arguments resolved to plain values, frozen, and checked again by
dataclasses.replace."""

import dataclasses

import pytest
import torch

from kvlab.config import MODELS
from kvlab.engine.config import DEFAULT_CACHED_TOKENS, EngineConfig


def test_the_defaults_resolve_to_plain_values_on_the_cpu():
    config = EngineConfig("tiny-llama", device="cpu")
    assert config.model is MODELS["tiny-llama"] and config.local is config.model
    assert (config.attention, config.dtype, config.device) == (
        "reference", torch.float32, torch.device("cpu"))
    assert config.num_blocks * config.block_size == DEFAULT_CACHED_TOKENS
    assert config.graph_max_len == min(MODELS["tiny-llama"].max_position, 8192)
    assert config.async_decode is False and config.cuda_graphs is None
    assert not config.decode_graphs and not config.offload_graphs
    assert (config.checkpoint_path, config.rank, config.world_size) == (None, 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1


def test_replace_checks_the_new_combination():
    config = EngineConfig("tiny-llama", device="cpu", block_size=8)
    assert dataclasses.replace(config, attention="reference").block_size == 8
    with pytest.raises(ValueError, match="attention='gqa': the CUDA kernels need device='cuda'"):
        dataclasses.replace(config, attention="gqa")
    with pytest.raises(ValueError, match="cuda_graphs=True: must be a bool, and False"):
        dataclasses.replace(config, cuda_graphs=True)
