"""A pool of fixed-size KV blocks: O(1) allocate and free over a free queue, with reference counts.

The pool only hands out block ids; it never sees a tensor. It also keeps the prefix cache: the map
from a full block's content key to the live block holding it, so that sequences with equal
prefixes can share blocks.
"""

import random
from collections import deque
from collections.abc import Hashable, Iterable

from kvlab.checks import check_block_size, check_positive_int


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free. Nothing was allocated."""

    def __init__(self, num_requested: int, num_free: int):
        super().__init__(
            f"out of KV blocks: {num_requested} requested, {num_free} free"
        )
        self.num_requested = num_requested
        self.num_free = num_free


class BlockPool:
    """`num_blocks` blocks of `block_size` token slots each, identified by ids 0..num_blocks-1.

    A block is free exactly when its ref count is 0; then it sits in the free queue. With a `seed`,
    the queue starts in a random order, so block tables come out scattered over the pool as in a
    server that has run for a while; without, blocks are handed out in id order.
    """

    def __init__(self, num_blocks: int, block_size: int, seed: int | None = None):
        check_positive_int("num_blocks", num_blocks)
        check_block_size(block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        order = list(range(num_blocks))
        if seed is not None:
            random.Random(seed).shuffle(order)
        self._free_queue: deque[int] = deque(order)
        self._ref_cnt = [0] * num_blocks
        # NOTE: a key is in `_cached` only while its block is in use (ref_cnt > 0).
        self._cached: dict[Hashable, int] = {}
        self._key_of: list[Hashable | None] = [None] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[block_id]

    def free_block_ids(self) -> list[int]:
        """The ids in the free queue, in the order they will be handed out."""
        return list(self._free_queue)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free_queue)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks, ref count 1 each. All or nothing: OutOfBlocksError."""
        free_queue, ref_cnt = self._free_queue, self._ref_cnt
        if num_blocks > len(free_queue):
            raise OutOfBlocksError(num_blocks, len(free_queue))
        block_ids = []
        for _ in range(num_blocks):  # NOTE: a plain loop; a comprehension costs 2x here
            block_id = free_queue.popleft()
            ref_cnt[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; the blocks must be in use."""
        ref_cnt = self._ref_cnt
        for block_id in block_ids:
            assert ref_cnt[block_id] > 0, f"block {block_id} is free: cannot share it"
            ref_cnt[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; at 0 references a block returns to the free queue."""
        ref_cnt = self._ref_cnt
        for block_id in block_ids:
            count = ref_cnt[block_id] - 1
            assert count >= 0, f"block {block_id} is already free"
            ref_cnt[block_id] = count
            if not count:
                key = self._key_of[block_id]
                if key is not None:
                    del self._cached[key]
                    self._key_of[block_id] = None
                self._free_queue.append(block_id)

    def lookup(self, key: Hashable) -> int | None:
        """The in-use block whose content key is `key`, if any."""
        return self._cached.get(key)

    def register(self, block_id: int, key: Hashable) -> None:
        """Record that the full, in-use block `block_id` holds the content `key`.

        The first block registered under a key keeps it; a later equal block stays private.
        """
        assert self._ref_cnt[block_id] > 0, f"block {block_id} is free: cannot register it"
        if key not in self._cached and self._key_of[block_id] is None:
            self._cached[key] = block_id
            self._key_of[block_id] = key
