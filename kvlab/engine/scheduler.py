"""`Scheduler`: which requests of `LLM.generate` run at each step, and the cache blocks they hold.

Continuous batching: requests wait in order of arrival; the head of the queue is admitted when
the free blocks hold its context and leave one for each running request. The requests admitted
between two decode steps are prefilled together (up to max_prefill_tokens tokens in one forward
pass; a longer prompt alone). Admitted requests decode together, one token each per step; a
finished one frees its blocks at once, and waiting ones join at the next step. When a step's new
blocks do not fit, the most recently admitted requests are preempted: they give their blocks back
and wait at the head of the queue with the tokens they have, to be recomputed (prefilled again)
later, so a full cache slows requests down instead of failing them. A request that the free
blocks cannot hold (the whole cache, or what an LLM sharing it leaves) is refused before anything
runs. Prompts that share whole blocks of tokens with a live request share those blocks (the
manager's prefix sharing), with their K, V written once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvlab.arith import ceil_div
from kvlab.cache import BlockManager
from kvlab.cache.block_manager import StepAllocation
from kvlab.checks import check_positive_int, is_int, is_real
from kvlab.config import ModelConfig


@dataclass
class Request:
    index: int
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    seq_id: int | None = None  # its sequence in the manager while it holds blocks
    alloc: object = None  # the manager's placement of its context, until it is prefilled
    finish_reason: str | None = None


def context(request: Request) -> list[int]:
    """What a request's prefill runs: its prompt, and after a preemption also the tokens it had
    decoded but the last (which the next decode step feeds)."""
    return request.prompt + request.tokens[:-1]


def context_len(request: Request) -> int:
    return len(request.prompt) + max(len(request.tokens) - 1, 0)


def make_requests(prompts, max_new_tokens, model: ModelConfig,
                  check_room: Callable[[int, int], None] | None = None) -> list[Request]:
    """generate's prompts (a list of token ids, or a list of them) and max_new_tokens (one limit,
    or one per prompt) as Requests. ValueError for a prompt that is empty, not token ids of
    `model`'s vocabulary, or longer than its context limit with its new tokens; check_room(i,
    total) checks that the cache holds prompt i with its new tokens."""
    if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                    and isinstance(prompts[0], str)):
        raise ValueError("prompts: kvlab has no tokenizer; pass token ids (a list of ints, "
                         "or a list of such lists)")
    if isinstance(prompts, list) and prompts and all(is_int(t) for t in prompts):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts: must be a non-empty list of token-id lists")
    limits = ([max_new_tokens] * len(prompts) if not isinstance(max_new_tokens, (list, tuple))
              else list(max_new_tokens))
    if len(limits) != len(prompts):
        raise ValueError(f"max_new_tokens: {len(limits)} limits for {len(prompts)} prompts")
    m, requests = model, []
    for i, (prompt, max_new_tokens) in enumerate(zip(prompts, limits, strict=True)):
        check_positive_int("max_new_tokens" if len(set(map(repr, limits))) == 1
                           else f"max_new_tokens[{i}]", max_new_tokens)
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError(f"prompts[{i}]: must be a non-empty list of token ids")
        bad = next((t for t in prompt if not (is_int(t) and 0 <= t < m.vocab_size)), None)
        if bad is not None:
            raise ValueError(f"prompts[{i}]: token {bad!r} is not an id in [0, "
                             f"{m.vocab_size}) ({m.name}'s vocabulary)")
        total = len(prompt) + max_new_tokens
        if total > m.max_position:
            raise ValueError(f"prompts[{i}]: {len(prompt)} tokens + max_new_tokens="
                             f"{max_new_tokens} exceed {m.name}'s context limit of "
                             f"{m.max_position} tokens")
        if check_room is not None:
            check_room(i, total)
        requests.append(Request(i, [int(t) for t in prompt], int(max_new_tokens)))
    return requests


# the latest arrival a serving run takes, in seconds after the call: a day (generate waits for
# it in real time, so a larger one is a mistake, not a run)
MAX_ARRIVAL_S = 86_400.0


def arrival_times(arrivals, num_requests: int) -> list[float]:
    """generate's arrivals as floats (all 0.0 for None); ValueError unless they are
    num_requests finite numbers in [0, MAX_ARRIVAL_S]."""
    if arrivals is None:
        return [0.0] * num_requests
    try:
        times = list(arrivals)
    except TypeError:
        times = None
    if times is None or len(times) != num_requests or not all(
            is_real(t) and 0 <= t <= MAX_ARRIVAL_S for t in times):
        raise ValueError(f"arrivals: must be {num_requests} numbers in [0, {MAX_ARRIVAL_S:,.0f}] "
                         "(seconds after the call: at most a day), one per prompt")
    return [float(t) for t in times]


class Scheduler:
    """The requests of one generate on a paged cache (the module's docstring): `waiting`, in
    order, and `running`, in the order they were admitted, with the blocks they hold.

    manager: the cache's BlockManager (shared by the LLMs that share the cache);
    max_prefill_tokens: the most context tokens one prefill pass takes; reserved_ids: the
    manager's sequences that no request may take (the CUDA graphs' scratch blocks), a list that
    each LLM sharing the cache adds to.
    """

    def __init__(self, manager: BlockManager, max_prefill_tokens: int, reserved_ids: list[int]):
        self.manager, self.block_size = manager, manager.block_size
        self.max_prefill_tokens, self.reserved_ids = max_prefill_tokens, reserved_ids
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.arrival_s: list[float] = []  # by request index: seconds after generate began

    @property
    def usable_blocks(self) -> int:
        """The cache's blocks that requests may take: all but the reserved ones."""
        return self.manager.num_blocks - len(self.reserved_ids)

    def check_room(self, i: int, total: int) -> None:
        """ValueError unless the free blocks hold prompts[i] with its new tokens, `total` tokens:
        those of the whole cache, less any that sequences outside this generate hold (an LLM
        sharing the cache), which nothing in it can free."""
        needed, usable, free = self._blocks(total), self.usable_blocks, self.manager.num_free_blocks
        if needed > usable:
            raise ValueError(f"prompts[{i}]: {total} tokens need {needed} blocks; the cache has "
                             f"{usable} for requests (num_blocks={self.manager.num_blocks})")
        if needed > free:
            raise ValueError(f"prompts[{i}]: {total} tokens need {needed} blocks; {free} of the "
                             f"cache's {usable} blocks for requests are free, the others hold "
                             "sequences outside this generate (an LLM sharing this cache)")

    def start(self, requests: list[Request], arrival_s: list[float]) -> None:
        """Queue a generate's requests, all waiting, in order of arrival."""
        self.waiting = deque(sorted(requests, key=lambda r: arrival_s[r.index]))
        self.running, self.arrival_s = [], arrival_s

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def admit(self, now: Callable[[], float]) -> list[Request]:
        """Take from the head of `waiting` the requests that have arrived by now() and are
        admissible, as many as one prefill pass holds (max_prefill_tokens; a longer one alone),
        place them and add them to `running`. Returns them, in order."""
        admitted, prompt_tokens, waiting = [], 0, self.waiting
        while (waiting and self.arrival_s[waiting[0].index] <= now()
               and self._admissible(waiting[0], len(self.running))
               and (not admitted or prompt_tokens + context_len(waiting[0])
                    <= self.max_prefill_tokens)):
            request = waiting.popleft()
            self.place(request)  # before the next check counts the free blocks
            self.running.append(request)
            admitted.append(request)
            prompt_tokens += context_len(request)
        return admitted

    def place(self, request: Request) -> None:
        """Give the request its context's blocks (the manager's add_sequence)."""
        tokens = context(request)
        request.alloc = self.manager.add_sequence(len(tokens), tokens)
        request.seq_id = request.alloc.seq_id

    def finish(self, request: Request) -> None:
        """A running request has ended: it leaves `running` and frees its blocks."""
        self.manager.free(request.seq_id)
        request.seq_id = None
        self.running.remove(request)

    def make_room(self) -> int:
        """Preempt the most recently admitted requests until the next decode step's new blocks
        fit: each gives its blocks back and waits at the head of the queue with the tokens it
        has, to be prefilled again (recomputed) when blocks free up. A request alone always
        fits (check_room checked it). Returns how many were preempted."""
        preempted, running = 0, self.running
        while len(running) > 1:
            if self._starting_blocks(running) <= self.manager.num_free_blocks:
                break
            victim = running.pop()
            self.manager.free(victim.seq_id)
            victim.seq_id = None
            self.waiting.appendleft(victim)
            preempted += 1
        return preempted

    def may_run_ahead(self, rows: list[Request], now_s: float) -> bool:
        """Whether the next decode step may be queued before this one's tokens (`rows`) are
        known: whether its batch is surely the same (async decode, kvlab.engine.llm)."""
        if any(r.finish_reason or len(r.tokens) + 1 >= r.max_new_tokens for r in rows):
            return False  # a row ended at the step before (its row here is dropped), or ends now
        waiting = self.waiting
        if (waiting and self.arrival_s[waiting[0].index] <= now_s
                and self._admissible(waiting[0], len(rows))):
            return False
        return self._starting_blocks(rows) <= self.manager.num_free_blocks  # else preempt first

    def wait_for_head(self, now: Callable[[], float]) -> None:
        """With nothing running, wait for the head of the queue to arrive (at most a second at
        a time, so that any finite arrival can be waited for). RuntimeError if it has arrived
        and the free blocks cannot hold it: nothing running would free any."""
        head = self.waiting[0]
        wait_s = self.arrival_s[head.index] - now()
        if wait_s > 0:
            time.sleep(min(wait_s, 1.0))
        elif not self._admissible(head, 0):
            free, needed = self.manager.num_free_blocks, self._blocks(context_len(head))
            raise RuntimeError(
                f"request {head.index} ({context_len(head)} tokens, {needed} blocks) can never "
                f"be admitted: nothing runs to free blocks, and {free} of the cache's "
                f"{self.usable_blocks} blocks for requests {'is' if free == 1 else 'are'} free "
                "(the others hold sequences outside this generate)")

    def append_one(self, rows: list[Request], token_ids: list[int] | None) -> StepAllocation:
        """Place a decode step's new token of each request of `rows` (token_ids None: their ids
        not known yet; `record_tokens` gives them)."""
        return self.manager.append_one([r.seq_id for r in rows], token_ids)

    def record_tokens(self, rows: list[Request], token_ids: list[int]) -> None:
        self.manager.record_tokens([r.seq_id for r in rows], token_ids)

    def release(self, requests: list[Request]) -> None:
        """Give back the blocks that `requests` hold, however generate ended: those of running
        requests and of requests placed but not prefilled yet (preempted and finished ones hold
        none). Empties the queues."""
        for request in requests:
            if request.seq_id is not None:
                self.manager.free(request.seq_id)
                request.seq_id = None
        self.waiting, self.running = deque(), []

    def _blocks(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def _admissible(self, request: Request, num_running: int) -> bool:
        """Whether the free blocks hold the request's context and still leave one for each of
        `num_running` running requests (the most the next step takes from each)."""
        return self._blocks(context_len(request)) + num_running <= self.manager.num_free_blocks

    def _starting_blocks(self, running: list[Request]) -> int:
        """The new blocks the next decode step of `running` takes: one for each full last
        block."""
        return sum(self.manager.seq_len(r.seq_id) % self.block_size == 0 for r in running)
