"""Scheduler on a BlockManager alone (no model): admission by free blocks and prefill budget,
preemption of the latest admitted, every block given back."""

from kvlab.cache import BlockManager
from kvlab.engine.scheduler import Request, Scheduler


def make_requests(*lens: int) -> list[Request]:
    """Requests of prompts of these lengths, no two sharing a block of tokens."""
    return [Request(i, [1000 * i + t for t in range(n)], max_new_tokens=8)
            for i, n in enumerate(lens)]


def make_scheduler(num_blocks=8, block_size=16, max_prefill_tokens=64) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, block_size), max_prefill_tokens, reserved_ids=[])


def test_admission_stops_at_the_prefill_budget_and_the_free_blocks():
    scheduler = make_scheduler(num_blocks=8, max_prefill_tokens=64)
    requests = make_requests(30, 30, 30, 40)
    scheduler.start(requests, [0.0] * 4)
    assert scheduler.admit(lambda: 0.0) == requests[:2]  # 60 tokens; a third passes 64
    assert scheduler.admit(lambda: 0.0) == requests[2:3]  # 2 blocks each, 2 left: 40 needs 3+3
    assert scheduler.running == requests[:3] and list(scheduler.waiting) == requests[3:]
    assert scheduler.manager.num_free_blocks == 2


def test_a_full_cache_preempts_the_latest_admitted_to_the_head_of_the_queue():
    scheduler = make_scheduler(num_blocks=6)
    requests = make_requests(32, 32, 16)
    scheduler.start(requests, [0.0] * 3)
    admitted = scheduler.admit(lambda: 0.0)
    assert admitted == requests[:2]  # 2 + 2 blocks, and 2 left: not 1 + 2 for the third
    assert scheduler.make_room() == 0  # each full last block takes one new block: 2 fit
    scheduler.manager.add_sequence(16)  # one block taken outside: one new block fits
    assert scheduler.make_room() == 1
    assert scheduler.running == requests[:1] and list(scheduler.waiting) == requests[1:]
    scheduler.release(requests)
    assert scheduler.manager.num_free_blocks == 5 and scheduler.is_finished()
