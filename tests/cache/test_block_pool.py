import pytest

from kvlab.cache import BlockPool, OutOfBlocksError


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


@pytest.mark.parametrize("num_blocks", [0, -1, 2.5])
def test_bad_num_blocks(num_blocks):
    with pytest.raises(ValueError, match="num_blocks="):
        BlockPool(num_blocks, 16)


def test_seed_scatters_the_free_queue_reproducibly():
    assert BlockPool(8, 16).allocate(8) == list(range(8))
    scattered = BlockPool(64, 16, seed=3).allocate(64)
    assert sorted(scattered) == list(range(64)) and scattered != list(range(64))
    assert BlockPool(64, 16, seed=3).allocate(64) == scattered
