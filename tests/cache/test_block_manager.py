import re

import numpy as np
import pytest

from kvlab.cache import BlockManager, OutOfBlocksError


def snapshot(manager: BlockManager):
    pool = manager.pool
    return (
        {s: (manager.block_table(s), manager.seq_len(s)) for s in manager.seq_ids},
        pool.free_block_ids(),
        [pool.ref_cnt(b) for b in range(pool.num_blocks)],
    )


def test_blocks_are_allocated_on_demand():
    manager = BlockManager(8, 4)
    seq_id = manager.add_sequence(5).seq_id
    assert len(manager.block_table(seq_id)) == 2
    manager.append(seq_id, 3)
    assert len(manager.block_table(seq_id)) == 2
    manager.append(seq_id, 1)
    assert len(manager.block_table(seq_id)) == 3
    assert manager.seq_len(seq_id) == 9


def test_slot_mapping_follows_the_block_table():
    manager = BlockManager(8, 4)
    manager.add_sequence(3)  # takes block 0
    seq_id = manager.add_sequence(6).seq_id
    first, second = manager.block_table(seq_id)
    assert manager.slot_mapping(seq_id, 2, 6) == [
        first * 4 + 2, first * 4 + 3, second * 4, second * 4 + 1
    ]


def test_equal_prefix_shares_full_blocks_only():
    manager = BlockManager(16, 4)
    a = manager.add_sequence(10, token_ids=range(10))
    b = manager.add_sequence(11, token_ids=range(11))
    table_a, table_b = manager.block_table(a.seq_id), manager.block_table(b.seq_id)
    assert table_b[:2] == table_a[:2]
    assert table_b[2] != table_a[2]  # partly filled in a: never shared by prefix
    assert b.write_start == 8
    assert [manager.pool.ref_cnt(x) for x in table_a] == [2, 2, 1]


def test_prefix_keys_chain_so_equal_blocks_after_different_prefixes_are_not_shared():
    manager = BlockManager(16, 2)
    a = manager.add_sequence(4, token_ids=[1, 2, 7, 7]).seq_id
    b = manager.add_sequence(4, token_ids=[3, 4, 7, 7]).seq_id
    assert not set(manager.block_table(a)) & set(manager.block_table(b))


def test_blocks_filled_by_append_become_shareable():
    manager = BlockManager(16, 4)
    a = manager.add_sequence(3, token_ids=[5, 6, 7]).seq_id
    manager.append(a, 1, token_ids=[8])
    b = manager.add_sequence(5, token_ids=[5, 6, 7, 8, 9]).seq_id
    assert manager.block_table(b)[0] == manager.block_table(a)[0]


def test_append_without_token_ids_ends_sharing():
    manager = BlockManager(16, 2)
    a = manager.add_sequence(1, token_ids=[5]).seq_id
    manager.append(a, 1)
    b = manager.add_sequence(2, token_ids=[5, 6]).seq_id
    assert manager.block_table(a)[0] != manager.block_table(b)[0]


def test_fork_shares_everything_and_append_copies_the_shared_partial_block():
    manager = BlockManager(8, 4)
    parent = manager.add_sequence(6).seq_id
    child = manager.fork(parent)
    assert manager.block_table(child) == manager.block_table(parent)
    alloc = manager.append(child, 1)
    old_last, new_last = manager.block_table(parent)[1], manager.block_table(child)[1]
    assert alloc.copies == ((old_last, new_last),)
    assert alloc.write_start == 6
    assert manager.pool.ref_cnt(old_last) == 1
    # The parent is now the only owner of its last block: no copy for it.
    assert manager.append(parent, 1).copies == ()


def test_append_after_a_shared_full_block_needs_no_copy():
    manager = BlockManager(8, 4)
    parent = manager.add_sequence(8).seq_id
    child = manager.fork(parent)
    alloc = manager.append(child, 2)
    assert alloc.copies == ()
    assert manager.block_table(child)[:2] == manager.block_table(parent)


def test_out_of_blocks_leaves_everything_unchanged():
    manager = BlockManager(4, 4)
    a = manager.add_sequence(6, token_ids=range(6)).seq_id
    child = manager.fork(a)
    before = snapshot(manager)
    for call in (
        lambda: manager.add_sequence(13, token_ids=range(13)),  # shares 1, needs 3 more
        lambda: manager.append(child, 11),  # copy-on-write + 2 blocks: 3 > 2 free
        lambda: manager.add_sequence(9),
    ):
        with pytest.raises(OutOfBlocksError):
            call()
        assert snapshot(manager) == before


def test_freeing_everything_returns_every_block():
    manager = BlockManager(8, 4)
    a = manager.add_sequence(9, token_ids=range(9)).seq_id
    b = manager.add_sequence(9, token_ids=range(9)).seq_id
    c = manager.fork(b)
    manager.append(c, 3)
    for seq_id in (a, b, c):
        manager.free(seq_id)
    assert manager.num_free_blocks == 8
    assert manager.pool.lookup((None, (0, 1, 2, 3))) is None


@pytest.mark.parametrize("seq_id", [99, -1, None, "a"])
def test_unknown_seq_id(seq_id):
    manager = BlockManager(8, 4)
    for call in (manager.free, manager.fork, manager.block_table, lambda s: manager.append(s, 1)):
        with pytest.raises(ValueError, match=f"seq_id={seq_id!r}: not a live sequence"):
            call(seq_id)


def test_freed_seq_id_is_rejected():
    manager = BlockManager(8, 4)
    seq_id = manager.add_sequence(3).seq_id
    manager.free(seq_id)
    with pytest.raises(ValueError, match="not a live sequence"):
        manager.free(seq_id)


def test_bad_token_counts():
    manager = BlockManager(8, 4)
    with pytest.raises(ValueError, match="num_tokens=0"):
        manager.add_sequence(0)
    with pytest.raises(ValueError, match="token_ids has 2 ids: must have one per token"):
        manager.add_sequence(3, token_ids=[1, 2])
    seq_id = manager.add_sequence(3).seq_id
    with pytest.raises(ValueError, match="num_tokens=-1: must be an integer >= 0"):
        manager.append(seq_id, -1)
    with pytest.raises(ValueError, match="num_tokens=1.0: must be an integer >= 0"):
        manager.append(seq_id, 1.0)
    with pytest.raises(ValueError, match="num_tokens=3.0: must be an integer >= 1"):
        manager.add_sequence(3.0)
    assert manager.num_free_blocks == 7


@pytest.mark.parametrize(
    ("token_ids", "message"),
    [
        # NOTE: int() once truncated these to [0, 1, 2, 3], sharing (and dropping) their K/V.
        ([0.5, 1.5, 2.5, 3.5], "token_ids[0]=0.5: must be an integer"),
        ([0, 1, 2, 0.5], "token_ids[3]=0.5: must be an integer"),
        ([0, 1, 2, 3.0], "token_ids[3]=3.0: must be an integer"),
        ([0, 1, "2", 3], "token_ids[2]='2': must be an integer"),
        ([0, None, 2, 3], "token_ids[1]=None: must be an integer"),
        ([0, 1, float("nan"), 3], "token_ids[2]=nan: must be an integer"),
        ([[0], 1, 2, 3], "token_ids[0]=[0]: must be an integer"),
        ([0, True, 2, 3], "token_ids[1]=True: must be an integer"),
        (np.arange(4.0), f"token_ids[0]={np.float64(0)!r}: must be an integer"),
        (4, "token_ids=4: must be None or a sequence of integers"),
    ],
)
def test_token_ids_must_be_integers(token_ids, message):
    manager = BlockManager(8, 2)
    a = manager.add_sequence(4, token_ids=[0, 1, 2, 3]).seq_id
    before = snapshot(manager)
    with pytest.raises(ValueError, match=re.escape(message)):
        manager.add_sequence(4, token_ids=token_ids)
    with pytest.raises(ValueError, match=re.escape(message)):
        manager.append(a, 4, token_ids=token_ids)
    assert snapshot(manager) == before


def test_numpy_integers_are_accepted_as_counts_and_token_ids():
    manager = BlockManager(np.int64(8), np.int64(2))
    a = manager.add_sequence(np.int64(3), token_ids=np.arange(3)).seq_id
    manager.append(a, np.int32(1), token_ids=np.array([3], dtype=np.int16))
    b = manager.add_sequence(5, token_ids=[0, 1, 2, 3, 4]).seq_id
    assert manager.block_table(b)[:2] == manager.block_table(a)
    assert type(manager.block_size) is int and type(manager.seq_len(a)) is int
    assert manager.block_table(np.int64(a)) == manager.block_table(a)


@pytest.mark.parametrize(("start", "stop"), [(0, 6), (-1, 2), (3, 2), (6, 6), (0.0, 2), (0, 2.0),
                                             (True, 2), (None, 2)])
def test_slot_mapping_range_must_lie_in_the_sequence(start, stop):
    manager = BlockManager(8, 4)
    seq_id = manager.add_sequence(5).seq_id
    message = (f"start={start!r}, stop={stop!r}: must be integers with "
               "0 <= start <= stop <= seq_len=5")
    with pytest.raises(ValueError, match=re.escape(message)):
        manager.slot_mapping(seq_id, start, stop)
    assert manager.slot_mapping(seq_id, 5, 5) == []


@pytest.mark.parametrize("seq_id", [True, 1.0])
def test_a_bool_or_float_is_not_a_seq_id(seq_id):
    manager = BlockManager(8, 4)
    manager.add_sequence(3)
    manager.add_sequence(3)  # seq_id 1 == True == 1.0
    before = snapshot(manager)
    for call in (manager.free, manager.fork, manager.block_table, lambda s: manager.append(s, 1)):
        with pytest.raises(ValueError, match=f"seq_id={seq_id!r}: not a live sequence"):
            call(seq_id)
    assert snapshot(manager) == before


def append_each(manager: BlockManager, seq_ids, token_ids):
    """What append_one must equal: one append per sequence, as (positions, slots, copies)."""
    positions, slots, copies = [], [], []
    for seq_id, token_id in zip(seq_ids, token_ids, strict=True):
        position = manager.seq_len(seq_id)
        copies += manager.append(seq_id, 1, [token_id]).copies
        positions.append(position)
        slots += manager.slot_mapping(seq_id, position, position + 1)
    return positions, slots, tuple(copies)


@pytest.mark.parametrize("seed", range(6))
def test_append_one_places_tokens_as_appends_one_by_one(seed):
    """Random adds (tiny alphabet: prefixes are shared), forks and frees, and decode steps of
    random batches on two managers, one stepping with append_one, the other with a loop of
    appends: the same slots, copies, block tables and free queue, and so the same blocks
    registered for prefix sharing (later adds share them alike). Half of append_one's steps
    place their tokens without ids and record them afterwards."""
    rng = np.random.default_rng(seed)
    batched, looped = BlockManager(40, 4, seed=seed), BlockManager(40, 4, seed=seed)
    for _ in range(60):
        live = batched.seq_ids
        action = rng.integers(4) if live else 0
        if action == 0:
            tokens = rng.integers(0, 2, rng.integers(1, 12)).tolist()
            token_ids = tokens if rng.integers(4) else None  # without ids: never shared
            try:
                batched.add_sequence(len(tokens), token_ids)
            except OutOfBlocksError:
                continue
            looped.add_sequence(len(tokens), token_ids)
        elif action == 1:
            parent = int(rng.choice(live))
            for manager in (batched, looped):
                manager.fork(parent)
        elif action == 2 and len(live) > 1:
            seq_id = int(rng.choice(live))
            for manager in (batched, looped):
                manager.free(seq_id)
        else:
            seq_ids = rng.permutation(live)[:rng.integers(1, len(live) + 1)].tolist()
            token_ids = rng.integers(0, 2, len(seq_ids)).tolist()
            before = snapshot(batched)
            later = bool(rng.integers(2))
            try:
                placed = batched.append_one(seq_ids, None if later else token_ids)
            except OutOfBlocksError:
                assert snapshot(batched) == before
                continue
            if later:
                batched.record_tokens(seq_ids, token_ids)
            expected = append_each(looped, seq_ids, token_ids)
            assert (placed.positions, placed.slots, placed.copies) == expected
        assert snapshot(batched) == snapshot(looped)


def test_append_one_copies_a_shared_last_block_only_while_it_is_shared():
    """A sequence and its fork share a partly filled block: the first to append copies it, the
    second then owns it alone and writes in place, so one free block is enough."""
    manager = BlockManager(3, 4)
    parent = manager.add_sequence(6).seq_id
    child = manager.fork(parent)
    shared = manager.block_table(parent)[1]
    placed = manager.append_one([parent, child], [1, 2])
    copy = manager.block_table(parent)[1]
    assert placed.copies == ((shared, copy),) and manager.block_table(child)[1] == shared
    assert placed.positions == [6, 6]
    assert placed.slots == [copy * 4 + 2, shared * 4 + 2]
    assert manager.num_free_blocks == 0


def test_append_one_starts_a_block_where_the_last_is_full_and_shares_filled_blocks():
    manager = BlockManager(8, 4)
    a = manager.add_sequence(4, [5, 6, 7, 8]).seq_id
    b = manager.add_sequence(3, [1, 2, 3]).seq_id
    placed = manager.append_one(np.array([a, b]), np.array([9, 4]))
    assert [len(manager.block_table(s)) for s in (a, b)] == [2, 1]
    assert placed.slots == [manager.block_table(a)[1] * 4, manager.block_table(b)[0] * 4 + 3]
    assert manager.add_sequence(5, [1, 2, 3, 4, 0]).write_start == 4  # b's block, now full


@pytest.mark.parametrize(("seq_ids", "token_ids", "error", "message"), [
    ([0, 99], [1, 1], ValueError, "seq_id=99: not a live sequence"),
    ([0, 1, 0], [1, 1, 1], ValueError, "seq_ids[2]=0: named twice"),
    ([0, 1], [1], ValueError, "token_ids has 1 ids: must have one per token (2)"),
    ([0, 1], [1, 2.0], ValueError, "token_ids[1]=2.0: must be an integer"),
    ([0, 1, 2], [1, 1, 1], OutOfBlocksError, "out of KV blocks: 3 requested, 2 free"),
    (0, [1], ValueError, "seq_ids=0: must be a sequence of seq ids"),
    (None, None, ValueError, "seq_ids=None: must be a sequence of seq ids"),
])
def test_a_failed_append_one_leaves_the_manager_unchanged(seq_ids, token_ids, error, message):
    """In the last case the blocks run out only at the third sequence: the first two must not
    have moved."""
    manager = BlockManager(3, 2)
    for _ in range(3):
        manager.add_sequence(2, [7, 7])  # the three share one full block; two are free
    before = snapshot(manager)
    with pytest.raises(error, match=re.escape(message)):
        manager.append_one(seq_ids, token_ids)
    assert snapshot(manager) == before


def test_a_block_filled_by_a_token_without_an_id_is_shared_once_the_id_is_recorded():
    manager = BlockManager(8, 4)
    a = manager.add_sequence(3, [5, 6, 7]).seq_id
    placed = manager.append_one([a])  # the token that fills the block, its id not known yet
    assert placed.positions == [3] and manager.seq_len(a) == 4
    early = manager.add_sequence(4, [5, 6, 7, 8])
    assert early.write_start == 0  # not offered yet
    manager.free(early.seq_id)
    manager.record_tokens([a], [8])
    late = manager.add_sequence(4, [5, 6, 7, 8])
    assert late.write_start == 4
    assert manager.block_table(late.seq_id) == manager.block_table(a)
    manager.append_one([a])
    manager.record_tokens([a], [9])
    manager.append_one([a], [1])  # all ids known again: a step with ids


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.append_one([0, 1], [1, 1]), "seq_ids[0]=0: its last 1 token(s) have no ids yet"),
    (lambda m: m.append(0, 1, [1]), "seq_id=0: its last 1 token(s) have no ids yet"),
    (lambda m: m.fork(0), "seq_id=0: its last 1 token(s) have no ids yet"),
    (lambda m: m.record_tokens([0, 1], [1, 1]), "seq_ids[1]=1: has no token placed without an id"),
    (lambda m: m.record_tokens([0, 0], [1, 1]), "a sequence named twice"),
    (lambda m: m.record_tokens([0], [1, 2]), "token_ids has 2 ids: must have one per token (1)"),
])
def test_tokens_without_ids_are_recorded_before_anything_else(call, message):
    """Sequence 0 has a token placed without its id; 1 has none. A call that would misplace
    ids raises and leaves the manager unchanged."""
    manager = BlockManager(8, 4)
    for _ in range(2):
        manager.add_sequence(2, [3, 4])
    manager.append_one([0])
    before = snapshot(manager)
    with pytest.raises(ValueError, match=re.escape(message)):
        call(manager)
    assert snapshot(manager) == before
