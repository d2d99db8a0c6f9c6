"""A pool of fixed-size KV blocks: O(1) allocate and free over a free queue, with reference counts.

The pool only hands out block ids; it never sees a tensor. It also keeps the prefix cache: the map
from a full block's content key to the live block holding it, so that sequences with equal
prefixes can share blocks.
"""

import random
from collections import Counter, deque
from collections.abc import Hashable, Iterable

from kvlab.checks import check_block_size, check_int, is_int

MAX_NUM_BLOCKS = 2**31 - 1  # block ids are int32 in the block tables the kernels read


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free. Nothing was allocated."""

    def __init__(self, num_requested: int, num_free: int):
        super().__init__(
            f"out of KV blocks: {num_requested} requested, {num_free} free"
        )
        self.num_requested = num_requested
        self.num_free = num_free


def as_list(name: str, values, allowed: str) -> list:
    """`values` (any iterable but a string) as a list; ValueError "{name}=...: must be
    {allowed}" for a string or what is not iterable."""
    try:
        if isinstance(values, (str, bytes)):
            raise TypeError
        return list(values)
    except TypeError:
        raise ValueError(f"{name}={values!r:.60}: must be {allowed}") from None


class BlockPool:
    """`num_blocks` blocks (at most MAX_NUM_BLOCKS) of `block_size` token slots each, identified
    by ids 0..num_blocks-1.

    A block is free exactly when its ref count is 0; then it sits in the free queue. With a `seed`,
    the queue starts in a random order, so block tables come out scattered over the pool as in a
    server that has run for a while; without, blocks are handed out in id order.

    Block ids are ints (Python or numpy integers, not bools). Every call given a bad argument
    raises ValueError before changing anything.
    """

    def __init__(self, num_blocks: int, block_size: int, seed: int | None = None):
        check_int("num_blocks", num_blocks, 1, MAX_NUM_BLOCKS)
        check_block_size(block_size)
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed={seed!r}: must be None or an integer")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        order = list(range(self.num_blocks))
        if seed is not None:
            random.Random(int(seed)).shuffle(order)
        self._free_queue: deque[int] = deque(order)
        self._ref_cnt = [0] * self.num_blocks
        # NOTE: a key is in `_cached` only while its block is in use (ref_cnt > 0).
        self._cached: dict[Hashable, int] = {}
        self._key_of: list[Hashable | None] = [None] * self.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    def ref_cnt(self, block_id: int) -> int:
        return self._ref_cnt[self._check_block_id("block_id", block_id)]

    def free_block_ids(self) -> list[int]:
        """The ids in the free queue, in the order they will be handed out."""
        return list(self._free_queue)

    def can_allocate(self, num_blocks: int) -> bool:
        check_int("num_blocks", num_blocks, 0)
        return num_blocks <= len(self._free_queue)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` free blocks, ref count 1 each. All or nothing: OutOfBlocksError."""
        check_int("num_blocks", num_blocks, 0)
        free_queue, ref_cnt = self._free_queue, self._ref_cnt
        if num_blocks > len(free_queue):
            raise OutOfBlocksError(int(num_blocks), len(free_queue))
        block_ids = []
        for _ in range(num_blocks):  # NOTE: a plain loop; a comprehension costs 2x here
            block_id = free_queue.popleft()
            ref_cnt[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block; the blocks must be in use."""
        ref_cnt = self._ref_cnt
        for block_id in self._check_in_use(block_ids, "share"):
            ref_cnt[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block; at 0 references a block returns to the free queue.

        The blocks must be in use, and a block listed n times must have at least n references.
        """
        block_ids = self._check_in_use(block_ids, "free")
        if len(block_ids) > 1 and len(set(block_ids)) < len(block_ids):
            self._check_repeats(block_ids)
        ref_cnt = self._ref_cnt
        for block_id in block_ids:
            count = ref_cnt[block_id] - 1
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
        block_id = self._check_block_id("block_id", block_id, action="register")
        if key not in self._cached and self._key_of[block_id] is None:
            self._cached[key] = block_id
            self._key_of[block_id] = key

    def _check_in_use(self, block_ids: Iterable[int], action: str) -> list[int]:
        """`block_ids` as a list of plain ints, each naming a block in use."""
        block_ids = as_list("block_ids", block_ids, "a sequence of block ids")
        ref_cnt, num_blocks = self._ref_cnt, self.num_blocks
        for block_id in block_ids:
            # NOTE: a cheap test of the common case (plain ints); the full check once one fails.
            if type(block_id) is not int or not 0 <= block_id < num_blocks or not ref_cnt[block_id]:
                return [
                    self._check_block_id(f"block_ids[{i}]", b, action)
                    for i, b in enumerate(block_ids)
                ]
        return block_ids

    def _check_block_id(self, name: str, block_id, action: str | None = None) -> int:
        """`block_id` as a plain int; with an `action`, the block must also be in use."""
        if not is_int(block_id) or not 0 <= block_id < self.num_blocks:
            raise ValueError(
                f"{name}={block_id!r}: must be a block id, an integer in [0, {self.num_blocks})"
            )
        if action is not None and not self._ref_cnt[block_id]:
            raise ValueError(
                f"{name}={block_id!r}: must be a block in use, not a free one (cannot {action} it)"
            )
        return int(block_id)

    def _check_repeats(self, block_ids: list[int]) -> None:
        for block_id, count in Counter(block_ids).items():
            if count > self._ref_cnt[block_id]:
                raise ValueError(
                    f"block_ids.count({block_id})={count}: must be <= ref_cnt({block_id})="
                    f"{self._ref_cnt[block_id]} (a block cannot be freed more often than it is "
                    f"referenced)"
                )
