"""kvlab.engine.graphs on the CPU: `HostInputs`, the host side of a graph's decode step, gives
what a step built from scratch would give (the batch's rows, padding rows, the used block-table
columns), while it asks the manager for a whole block table only for a sequence it has not seen
one token ago."""

import numpy as np
import pytest

from kvlab.cache import BlockManager
from kvlab.engine.graphs import (
    MIN_SPAN,
    POSITIONS,
    SEQ_LENS,
    SLOTS,
    TOKEN_IDS,
    HostInputs,
    bucket,
    span,
)

BLOCK_SIZE, MAX_BLOCKS, MAX_ROWS, SCRATCH_BLOCK = 4, 8, 8, 0
SCRATCH_SLOT = SCRATCH_BLOCK * BLOCK_SIZE


def make_manager(num_blocks: int = 64) -> BlockManager:
    """A manager whose block 0 is the graphs' scratch block, as the engine reserves it."""
    manager = BlockManager(num_blocks, BLOCK_SIZE)
    manager.add_sequence(1)
    return manager


def make_host() -> HostInputs:
    return HostInputs(MAX_ROWS, MAX_BLOCKS, BLOCK_SIZE, SCRATCH_BLOCK, SCRATCH_SLOT)


def step(manager: BlockManager, host: HostInputs, seq_ids: list[int],
         size: int | None = None) -> list[int]:
    """A decode step of `seq_ids` (token 100 + row) in `size` rows (default its bucket): place
    the tokens, fill `host`, check what it gives against the step's batch and the manager's
    tables. Returns the sequences whose tables `fill` asked the manager for."""
    size = size or bucket(len(seq_ids))
    token_ids = [100 + row for row in range(len(seq_ids))]
    placed = manager.append_one(seq_ids, token_ids)
    asked = []

    def block_table(seq_id):
        asked.append(seq_id)
        return manager.block_table(seq_id)

    inputs, tables = host.fill(size, seq_ids, token_ids, placed.positions, placed.slots,
                               block_table)
    pad = size - len(seq_ids)
    assert inputs.shape == (4, size)
    assert inputs[TOKEN_IDS].tolist() == token_ids + [0] * pad
    assert inputs[POSITIONS].tolist() == placed.positions + [0] * pad
    assert inputs[SLOTS].tolist() == placed.slots + [SCRATCH_SLOT] * pad
    assert inputs[SEQ_LENS].tolist() == [p + 1 for p in placed.positions] + [1] * pad
    used = max(-(-manager.seq_len(s) // BLOCK_SIZE) for s in seq_ids)
    assert tables.shape == (size, used)
    for row, seq_id in enumerate(seq_ids):  # entries past a table: never read, any valid id
        table = manager.block_table(seq_id)
        assert tables[row, :len(table)].tolist() == table
    assert tables.numpy().max() < manager.num_blocks
    assert (tables[len(seq_ids):] == SCRATCH_BLOCK).all()
    return asked


def add(manager: BlockManager, *lens: int) -> list[int]:
    return [manager.add_sequence(n).seq_id for n in lens]


def test_the_first_step_asks_for_every_table_and_pads_the_rest():
    manager, host = make_manager(), make_host()
    seq_ids = add(manager, 5, 9, 2)
    assert step(manager, host, seq_ids) == seq_ids  # row 3 of bucket 4 is padding


def test_the_next_steps_write_only_the_entry_of_each_new_token():
    """Lengths 6, 7, 8 after the first step: over the next three steps each starts a block."""
    manager, host = make_manager(), make_host()
    seq_ids = add(manager, 5, 6, 7)
    step(manager, host, seq_ids)
    for _ in range(3):
        assert step(manager, host, seq_ids) == []
    assert [len(manager.block_table(s)) for s in seq_ids] == [3, 3, 3]


def test_a_copy_on_write_changes_the_entry_of_the_copied_block():
    manager, host = make_manager(), make_host()
    parent = add(manager, 5)[0]
    step(manager, host, [parent])
    child = manager.fork(parent)  # shares the partly filled block 1
    shared = manager.block_table(parent)[1]
    assert step(manager, host, [parent, child]) == [child]
    assert manager.block_table(parent)[1] != shared  # the parent copied it, in its old row
    assert manager.block_table(child)[1] == shared


def test_rows_shift_up_when_a_request_in_the_middle_leaves():
    manager, host = make_manager(), make_host()
    a, b, c, d = add(manager, 3, 10, 17, 4)
    step(manager, host, [a, b, c, d])
    manager.free(b)
    assert step(manager, host, [a, c, d]) == []


def test_a_batch_that_shrinks_pads_its_rows_and_one_that_grows_asks_for_its_new_tables():
    manager, host = make_manager(), make_host()
    a, b, c, d = add(manager, 3, 10, 17, 4)
    step(manager, host, [a, b, c, d])
    for seq_id in (c, d):
        manager.free(seq_id)
    assert step(manager, host, [a, b], size=4) == []  # rows 2 and 3 padding
    assert step(manager, host, [a, b]) == []  # bucket 2
    e, f, g = add(manager, 6, 1, 30)
    assert step(manager, host, [a, b, e]) == [e]
    assert step(manager, host, [a, b, e, f, g]) == [f, g]  # bucket 8
    assert step(manager, host, [a, g]) == []


def test_rows_past_a_smaller_batch_keep_their_tables():
    """Only the copy pads them: a sequence that comes back to its row at the length it left
    with needs no table."""
    manager, host = make_manager(), make_host()
    a, b = add(manager, 3, 10)
    step(manager, host, [a, b])
    step(manager, host, [a])
    assert step(manager, host, [a, b]) == []


def test_a_sequence_taking_another_ones_row_is_asked_for():
    manager, host = make_manager(), make_host()
    long, short = add(manager, 20, 3)
    step(manager, host, [long])
    manager.free(long)
    assert step(manager, host, [short]) == [short]


def test_a_sequence_that_missed_steps_is_asked_for():
    """Eager steps (or a step of a batch without `b`) grew `a` behind the host's back."""
    manager, host = make_manager(), make_host()
    a, b = add(manager, 3, 6)
    step(manager, host, [a, b])
    for _ in range(3):
        manager.append_one([a], [7])
    assert step(manager, host, [a, b]) == [a]
    manager.append_one([a], [7])
    assert step(manager, host, [b, a]) == [a]  # a moved, but not from one token ago


@pytest.mark.parametrize("seed", range(4))
def test_random_batches_give_what_a_step_from_scratch_gives(seed):
    """Requests join, leave, reorder, fork, grow, and some take steps elsewhere, across many
    steps of changing buckets; every step is checked against the manager (in `step`)."""
    rng = np.random.default_rng(seed)
    manager, host = make_manager(), make_host()
    live = add(manager, *rng.integers(1, 12, 5).tolist())
    longest = MAX_BLOCKS * BLOCK_SIZE - 1  # one more token fills the graphs' tables
    for _ in range(60):
        if rng.random() < 0.2 and len(live) > 1:
            manager.free(live.pop(rng.integers(len(live))))
        if rng.random() < 0.2:
            live.append(manager.fork(live[rng.integers(len(live))]))
        if rng.random() < 0.2:
            live += add(manager, int(rng.integers(1, 12)))
        for seq_id in [s for s in live if manager.seq_len(s) == longest]:
            manager.free(seq_id)
            live.remove(seq_id)
        while len(live) > MAX_ROWS:
            manager.free(live.pop())
        if rng.random() < 0.3:
            rng.shuffle(live)
        live = live or add(manager, 1)
        if rng.random() < 0.2 and manager.seq_len(live[0]) < longest - 3:
            for _ in range(3):  # steps elsewhere
                manager.append_one(live[:1], [7])
        step(manager, host, live)


def test_successive_fills_alternate_between_two_sets_of_buffers():
    """A step queued before the previous one's copies ran must not rewrite their sources: fill
    n+1 leaves what fill n gave as it was, and fill n+2 reuses fill n's buffers. Token ids
    None (filled on the GPU) are zeros."""
    manager, host = make_manager(), make_host()
    (seq_id,) = add(manager, 5)
    given = []
    for token in (7, None, 9):
        placed = manager.append_one([seq_id], None if token is None else [token])
        if token is None:
            manager.record_tokens([seq_id], [8])
        inputs, tables = host.fill(1, [seq_id], None if token is None else [token],
                                   placed.positions, placed.slots, manager.block_table)
        given.append((inputs, tables, inputs.clone(), tables.clone()))
    (first, first_tables, first_was, first_tables_was), (second, second_tables, *_) = given[:2]
    assert second[TOKEN_IDS].tolist() == [0]
    assert second.data_ptr() != first.data_ptr()
    assert second_tables.data_ptr() != first_tables.data_ptr()
    assert given[2][0].data_ptr() == first.data_ptr()
    assert given[1][0].tolist() == given[1][2].tolist()  # fill 3 left fill 2's buffers alone
    assert given[1][1].tolist() == given[1][3].tolist()
    assert first_was[TOKEN_IDS].tolist() == [7] and given[2][0][TOKEN_IDS].tolist() == [9]


def test_graph_buckets_are_powers_of_two_up_to_256():
    assert [bucket(n) for n in (1, 2, 3, 5, 64, 65, 256)] == [1, 2, 4, 8, 64, 128, 256]
    assert bucket(257) is None


def test_graph_spans_double_from_min_span_up_to_the_limit():
    assert MIN_SPAN == 512
    assert [span(n, 8192) for n in (1, 512, 513, 1024, 1025, 4097, 8192)] == [
        512, 512, 1024, 1024, 2048, 8192, 8192]
    assert span(5000, 6000) == 6000  # a limit between two spans is a span of its own
    assert span(100, 300) == 300  # as is a limit below MIN_SPAN
