"""What `LLM.generate` returns, and the clock it times with."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


def clock_ms(device: torch.device) -> float:
    """Wall-clock ms, after the GPU's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3


@dataclass
class Generation:
    """What `LLM.generate` returns. tokens[i]: request i's new tokens; finish_reasons[i]:
    "length" (max_new_tokens reached) or "eos"; prefill_ms[i]: the prefill that ran its prompt
    (wall clock, the GPU synchronised; prompts prefilled together each get the whole pass's
    time; a preempted request's prefills add up); step_ms[s], step_batch[s]: decode step s's
    time and how many requests it decoded; preemptions: how many
    times a request gave its blocks back to be recomputed later; attention: what decoded them;
    arrival_s[i], first_token_s[i], finish_s[i]: when request i arrived, got its first token and
    its last, in seconds after generate() began; splits[s]: with offload, KVPR's l at decode
    step s (the cached tokens whose K, V were recomputed), else None."""

    tokens: list[list[int]]
    finish_reasons: list[str]
    prefill_ms: list[float]
    step_ms: list[float]
    step_batch: list[int]
    preemptions: int
    attention: str
    arrival_s: list[float]
    first_token_s: list[float]
    finish_s: list[float]
    splits: list[int] | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens decoded per second of decode steps (prefill excluded); 0 without a step."""
        total_s = sum(self.step_ms) / 1e3
        return sum(self.step_batch) / total_s if total_s > 0 else 0.0
