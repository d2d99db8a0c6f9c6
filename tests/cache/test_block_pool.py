import re

import numpy as np
import pytest

from kvlab.cache import BlockPool, OutOfBlocksError


def pool_state(pool: BlockPool):
    return (
        pool.free_block_ids(),
        [pool.ref_cnt(b) for b in range(pool.num_blocks)],
        pool.lookup("key"),
    )


def test_allocate_takes_distinct_blocks_with_ref_cnt_one():
    pool = BlockPool(8, 16)
    block_ids = pool.allocate(5)
    assert len(set(block_ids)) == 5
    assert all(pool.ref_cnt(b) == 1 for b in block_ids)
    assert pool.num_free_blocks == 3


def test_free_returns_blocks_only_when_last_reference_drops():
    pool = BlockPool(4, 16)
    block_ids = pool.allocate(2)
    pool.share(block_ids)
    pool.free(block_ids)
    assert pool.num_free_blocks == 2
    pool.free(block_ids)
    assert pool.num_free_blocks == 4
    assert sorted(pool.free_block_ids()) == [0, 1, 2, 3]


def test_out_of_blocks_carries_numbers_and_allocates_nothing():
    pool = BlockPool(4, 16)
    pool.allocate(3)
    with pytest.raises(OutOfBlocksError) as err:
        pool.allocate(2)
    assert (err.value.num_requested, err.value.num_free) == (2, 1)
    assert "2 requested, 1 free" in str(err.value)
    assert pool.num_free_blocks == 1


def test_freed_key_is_forgotten():
    pool = BlockPool(2, 4)
    [block_id] = pool.allocate(1)
    pool.register(block_id, (None, (1, 2, 3, 4)))
    assert pool.lookup((None, (1, 2, 3, 4))) == block_id
    pool.free([block_id])
    assert pool.lookup((None, (1, 2, 3, 4))) is None


def test_first_registration_of_a_key_wins():
    pool = BlockPool(2, 4)
    a, b = pool.allocate(2)
    pool.register(a, "key")
    pool.register(b, "key")
    assert pool.lookup("key") == a
    pool.free([b])
    assert pool.lookup("key") == a


@pytest.mark.parametrize("block_size", [0, 3, 48, 512, -16, 16.0, True])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match=r"block_size=.*power of two in \[1, 256\]"):
        BlockPool(8, block_size)


@pytest.mark.parametrize("num_blocks", [0, -1, 2.5, 4.0, "4", True, 2**40, 2**70])
def test_bad_num_blocks(num_blocks):
    """Block ids are int32 in the kernels' block tables: 2**31 blocks and more are refused
    (2**70 was an OverflowError from building the free queue)."""
    with pytest.raises(ValueError, match=re.escape(f"num_blocks={num_blocks!r}: must be an "
                                                   "integer in [1, 2147483647]")):
        BlockPool(num_blocks, 16)


@pytest.mark.parametrize("seed", [1.5, "3", [3]])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match=re.escape(f"seed={seed!r}: must be None or an integer")):
        BlockPool(8, 16, seed=seed)


BAD_ID = r"must be a block id, an integer in \[0, 4\)"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda pool: pool.free([-1]), rf"block_ids\[0\]=-1: {BAD_ID}"),
        (lambda pool: pool.free([0, 4]), rf"block_ids\[1\]=4: {BAD_ID}"),
        (lambda pool: pool.free([0, True]), rf"block_ids\[1\]=True: {BAD_ID}"),
        (lambda pool: pool.free([0, 1.0]), rf"block_ids\[1\]=1.0: {BAD_ID}"),
        (lambda pool: pool.free([0, None]), rf"block_ids\[1\]=None: {BAD_ID}"),
        (lambda pool: pool.free([0, 3]),
         r"block_ids\[1\]=3: must be a block in use, not a free one \(cannot free it\)"),
        (lambda pool: pool.free([0, 0]), r"block_ids.count\(0\)=2: must be <= ref_cnt\(0\)=1"),
        (lambda pool: pool.free([1, 0, 1, 1]),
         r"block_ids.count\(1\)=3: must be <= ref_cnt\(1\)=2"),
        (lambda pool: pool.share([0, 3]),
         r"block_ids\[1\]=3: must be a block in use, not a free one \(cannot share it\)"),
        (lambda pool: pool.share([0, -1]), rf"block_ids\[1\]=-1: {BAD_ID}"),
        (lambda pool: pool.register(3, "other"),
         r"block_id=3: must be a block in use, not a free one \(cannot register it\)"),
        (lambda pool: pool.register(-1, "other"), rf"block_id=-1: {BAD_ID}"),
        (lambda pool: pool.ref_cnt(4), rf"block_id=4: {BAD_ID}"),
        (lambda pool: pool.allocate(-1), r"num_blocks=-1: must be an integer >= 0"),
        (lambda pool: pool.allocate(1.0), r"num_blocks=1.0: must be an integer >= 0"),
        (lambda pool: pool.allocate(True), r"num_blocks=True: must be an integer >= 0"),
        (lambda pool: pool.can_allocate(-1), r"num_blocks=-1: must be an integer >= 0"),
        (lambda pool: pool.free(5), r"block_ids=5: must be a sequence of block ids"),
        (lambda pool: pool.share(None), r"block_ids=None: must be a sequence of block ids"),
    ],
)
def test_bad_calls_raise_value_error_and_change_nothing(call, message):
    pool = BlockPool(4, 16)
    pool.allocate(3)  # blocks 0, 1, 2 in use; block 3 free
    pool.share([1])  # block 1: ref_cnt 2
    pool.register(0, "key")
    before = pool_state(pool)
    with pytest.raises(ValueError, match=message):
        call(pool)
    assert pool_state(pool) == before


def test_a_block_may_be_freed_as_often_as_it_is_referenced():
    pool = BlockPool(4, 16)
    [block_id] = pool.allocate(1)
    pool.share([block_id, block_id])
    pool.free(iter([block_id, block_id, block_id]))
    assert pool.num_free_blocks == 4


def test_numpy_integers_are_accepted_and_stored_as_ints():
    pool = BlockPool(np.int64(4), np.int32(16), seed=np.int64(1))
    assert type(pool.num_blocks) is int and type(pool.block_size) is int
    block_ids = pool.allocate(np.int64(2))
    pool.share(np.array(block_ids))
    pool.register(np.int16(block_ids[0]), "key")
    pool.free(np.array(block_ids))
    pool.free(np.array(block_ids))
    assert pool.num_free_blocks == 4 and pool.lookup("key") is None
    assert all(type(b) is int for b in pool.free_block_ids())


def test_seed_scatters_the_free_queue_reproducibly():
    assert BlockPool(8, 16).allocate(8) == list(range(8))
    scattered = BlockPool(64, 16, seed=3).allocate(64)
    assert sorted(scattered) == list(range(64)) and scattered != list(range(64))
    assert BlockPool(64, 16, seed=3).allocate(64) == scattered
