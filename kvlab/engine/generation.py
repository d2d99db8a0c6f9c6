"""What `LLM.generate` returns, the clock it times with, and how it records each new token."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def clock_ms(device: torch.device) -> float:
    """Wall-clock ms, after the GPU's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() * 1e3


class SampledTokens:
    """A decode step's sampled token ids on their way to the host. `ids` (int64 [batch], on the
    GPU) is what a next step queued at once may read; the copy to page-locked host memory is
    queued behind the sampling, and `wait` returns the ids when it is done."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids
        self._host = ids.to("cpu", non_blocking=True)  # page-locked, when ids is on a GPU
        self._copied = None
        if ids.is_cuda:  # the copy is queued on the current stream of ids' device
            self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(ids.device))

    def wait(self) -> list[int]:
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.tolist()


class TokenLog:
    """The new tokens of a generate's requests as they come (`take`), and when each request got
    its first token and its last (`first_token_s`, `finish_s`: seconds after `began`, a
    time.perf_counter() reading). A request here: `index`, `tokens`, `max_new_tokens` and
    `finish_reason`. stop: the EOS token id, or None; on_finish(done, total) is called as each
    request finishes."""

    def __init__(self, num_requests: int, stop: int | None, began: float,
                 on_finish: Callable[[int, int], None] | None):
        self.stop, self.began, self.on_finish = stop, began, on_finish
        self.first_token_s, self.finish_s = [0.0] * num_requests, [0.0] * num_requests

    def take(self, request, token: int) -> bool:
        """Record the request's new token; True when it ends the request (EOS or its limit)."""
        request.tokens.append(int(token))
        now = time.perf_counter() - self.began
        if len(request.tokens) == 1:
            self.first_token_s[request.index] = now
        if token == self.stop:
            request.finish_reason = "eos"
        elif len(request.tokens) == request.max_new_tokens:
            request.finish_reason = "length"
        if not request.finish_reason:
            return False
        self.finish_s[request.index] = now
        if self.on_finish is not None:
            self.on_finish(sum(f > 0 for f in self.finish_s), len(self.finish_s))
        return True


@dataclass
class Generation:
    """What `LLM.generate` returns. tokens[i]: request i's new tokens; finish_reasons[i]:
    "length" (max_new_tokens reached) or "eos"; prefill_ms[i]: the prefill that ran its prompt
    (wall clock, the GPU synchronised; prompts prefilled together each get the whole pass's
    time; a preempted request's prefills add up); step_ms[s], step_batch[s]: decode step s's
    time, wall clock until its tokens were on the host, from the tokens of the decode step
    before it, whether it was queued ahead of them (LLM's async_decode) or launched after them
    (from its launch where a prefill ran since, and for the first; with offload, from its
    start), and how many requests it gave a
    token (a row dropped after an EOS not counted, so possibly 0); preemptions: how many
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
