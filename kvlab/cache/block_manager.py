"""Block tables for many sequences over one BlockPool: prefix sharing, fork and copy-on-write.

Tensor-free: it decides which block and slot every token goes to, and which blocks must be copied
before a write; `PagedKVCache` applies those decisions to the K/V tensors.

Prefix sharing. When a sequence comes with token ids, each of its full blocks gets the key
`(parent_block_id, tokens_in_block)`, where the parent is the block before it (None for the
first). Keys chain, so two blocks have equal keys exactly when the whole prefixes up to their ends
are equal. No hash of a hash is involved, so no collision can alias two different prefixes.
"""

from dataclasses import dataclass, field

from kvlab.arith import ceil_div
from kvlab.cache.block_pool import BlockPool, OutOfBlocksError, as_list
from kvlab.checks import check_int, check_positive_int, is_int


@dataclass(frozen=True)
class Allocation:
    """What the cache must do after the manager placed tokens of sequence `seq_id`.

    copies: (src_block_id, dst_block_id) pairs to copy first (copy-on-write).
    write_start: the first token position whose K/V must be written; earlier tokens live in blocks
        that were already written (shared prefix blocks, or the sequence's previous tokens).
    """

    seq_id: int
    write_start: int
    copies: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StepAllocation:
    """What the cache must do after the manager placed one new token in each of many sequences
    (a decode step: `BlockManager.append_one`).

    positions[i], slots[i]: the position of sequence i's new token (its length before) and the
        cache slot it goes to (`block_id * block_size + offset`).
    copies: (src_block_id, dst_block_id) pairs to copy first (copy-on-write), of all sequences.
    """

    positions: list[int]
    slots: list[int]
    copies: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)  # slots: attribute reads stay cheap on the decode path
class _Sequence:
    block_ids: list[int]
    num_tokens: int
    # None once `append` added tokens without ids: later full blocks are then never shared.
    token_ids: list[int] | None = field(default=None)
    # the last tokens placed by append_one before their ids were known (record_tokens gives them)
    unknown: int = 0


def _check_ids_known(name: str, seq_id: int, seq: _Sequence) -> None:
    """ValueError while the sequence has tokens that append_one placed without ids."""
    if seq.unknown:
        raise ValueError(f"{name}={seq_id}: its last {seq.unknown} token(s) have no ids yet; "
                         "record_tokens first")


class BlockManager:
    """Allocates blocks to sequences. Every failed call leaves the manager unchanged.

    Counts, positions and token ids are integers (Python or numpy, not bools); anything else
    raises ValueError naming the argument.
    """

    def __init__(self, num_blocks: int, block_size: int, seed: int | None = None):
        self.pool = BlockPool(num_blocks, block_size, seed)
        self.block_size = self.pool.block_size
        self._seqs: dict[int, _Sequence] = {}
        self._next_seq_id = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def seq_ids(self) -> list[int]:
        return list(self._seqs)

    def seq_len(self, seq_id: int) -> int:
        return self._seq(seq_id).num_tokens

    def block_table(self, seq_id: int) -> list[int]:
        """Physical block ids of the sequence, in logical order."""
        return list(self._seq(seq_id).block_ids)

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> list[int]:
        """Slot `block_id * block_size + offset` of each token position in [start, stop), for
        integers 0 <= start <= stop <= seq_len."""
        seq = self._seq(seq_id)
        if not (is_int(start) and is_int(stop) and 0 <= start <= stop <= seq.num_tokens):
            raise ValueError(
                f"start={start!r}, stop={stop!r}: must be integers with "
                f"0 <= start <= stop <= seq_len={seq.num_tokens}"
            )
        block_ids, bs = seq.block_ids, self.block_size
        return [block_ids[pos // bs] * bs + pos % bs for pos in range(start, stop)]

    def add_sequence(self, num_tokens: int, token_ids=None) -> Allocation:
        """Place a new sequence of `num_tokens` tokens, reusing live blocks with an equal prefix."""
        check_positive_int("num_tokens", num_tokens)
        num_tokens = int(num_tokens)
        token_ids = self._check_token_ids(token_ids, num_tokens)
        shared = self._match_prefix(token_ids) if token_ids is not None else []
        num_new = ceil_div(num_tokens, self.block_size) - len(shared)
        if not self.pool.can_allocate(num_new):
            raise OutOfBlocksError(num_new, self.pool.num_free_blocks)
        self.pool.share(shared)
        seq = _Sequence(shared + self.pool.allocate(num_new), num_tokens, token_ids)
        self._register_full_blocks(seq, first_block=len(shared))
        seq_id = self._new_seq_id()
        self._seqs[seq_id] = seq
        return Allocation(seq_id, write_start=len(shared) * self.block_size)

    def append(self, seq_id: int, num_tokens: int, token_ids=None) -> Allocation:
        """Extend a sequence by `num_tokens` tokens.

        A partly filled last block shared with another sequence is first replaced by a private copy
        (copy-on-write). Appending without token ids ends prefix sharing for the later blocks.
        """
        seq = self._seq(seq_id)
        check_int("num_tokens", num_tokens, 0)
        num_tokens = int(num_tokens)
        token_ids = self._check_token_ids(token_ids, num_tokens)
        _check_ids_known("seq_id", seq_id, seq)
        old_len, bs = seq.num_tokens, self.block_size
        room = len(seq.block_ids) * bs - old_len
        cow = num_tokens > 0 and room > 0 and self.pool.ref_cnt(seq.block_ids[-1]) > 1
        num_new = ceil_div(max(0, num_tokens - room), bs) + cow
        if not self.pool.can_allocate(num_new):
            raise OutOfBlocksError(num_new, self.pool.num_free_blocks)
        new_block_ids = self.pool.allocate(num_new)
        copies = ()
        if cow:
            src, dst = seq.block_ids[-1], new_block_ids.pop()
            self.pool.free([src])
            seq.block_ids[-1] = dst
            copies = ((src, dst),)
        seq.block_ids.extend(new_block_ids)
        seq.num_tokens += num_tokens
        if seq.token_ids is not None and token_ids is not None:
            seq.token_ids.extend(token_ids)
            self._register_full_blocks(seq, first_block=old_len // bs)
        elif num_tokens:
            seq.token_ids = None
        return Allocation(seq_id, write_start=old_len, copies=copies)

    def append_one(self, seq_ids, token_ids=None) -> StepAllocation:
        """Extend each sequence `seq_ids[i]` by the one token `token_ids[i]` (a decode step).

        The same placement, block for block, as `append(seq_ids[i], 1, [token_ids[i]])` for each
        i in order, checked once for the whole batch: all or nothing. token_ids None places
        tokens whose ids are not known yet (a decode step queued before the previous step's
        tokens reached the host): `record_tokens` gives them later, in order, and until then
        the blocks they fill are not offered for prefix sharing. Raises ValueError for a
        sequence that is not live or is named twice, for token ids that are not one integer
        per sequence, or for ids given while a sequence still has tokens without them;
        OutOfBlocksError when the new blocks do not fit.
        """
        seq_ids = as_list("seq_ids", seq_ids, "a sequence of seq ids")
        seqs = [self._seq(seq_id) for seq_id in seq_ids]
        if len(set(seq_ids)) < len(seq_ids):
            index, seq_id = next((i, s) for i, s in enumerate(seq_ids) if seq_ids.index(s) < i)
            raise ValueError(f"seq_ids[{index}]={seq_id!r}: named twice; a step appends one "
                             "token to each sequence once")
        known = token_ids is not None
        if known:
            token_ids = self._check_token_ids(token_ids, len(seqs))
            for i, seq in enumerate(seqs):
                _check_ids_known(f"seq_ids[{i}]", seq_ids[i], seq)
        bs = self.block_size
        # NOTE: counted in order, as the appends one by one would: a shared last block is copied
        # only while another sequence still refers to it, so when all its sharers are in the
        # batch, the last of them writes it in place. `refs`: what the earlier copies left.
        refs: dict[int, int] = {}
        copy_on_write: set[int] = set()  # indices of the sequences that copy their last block
        num_new = 0
        for i, seq in enumerate(seqs):
            if len(seq.block_ids) * bs == seq.num_tokens:  # full: the token starts a new block
                num_new += 1
                continue
            last = seq.block_ids[-1]
            num_refs = refs[last] if last in refs else self.pool.ref_cnt(last)
            if num_refs > 1:
                refs[last] = num_refs - 1
                copy_on_write.add(i)
                num_new += 1
        if not self.pool.can_allocate(num_new):
            raise OutOfBlocksError(num_new, self.pool.num_free_blocks)
        new_block_ids = iter(self.pool.allocate(num_new))
        positions, slots, copies = [], [], []
        for i, seq in enumerate(seqs):
            position = seq.num_tokens
            if len(seq.block_ids) * bs == position:
                seq.block_ids.append(next(new_block_ids))
            elif i in copy_on_write:
                src, dst = seq.block_ids[-1], next(new_block_ids)
                self.pool.free([src])
                seq.block_ids[-1] = dst
                copies.append((src, dst))
            seq.num_tokens = position + 1
            if seq.token_ids is not None:
                if known:
                    self._add_token_id(seq, token_ids[i])
                else:
                    seq.unknown += 1
            positions.append(position)
            slots.append(seq.block_ids[position // bs] * bs + position % bs)
        return StepAllocation(positions, slots, tuple(copies))

    def record_tokens(self, seq_ids, token_ids) -> None:
        """Give the ids of tokens that `append_one` placed without them: token_ids[i] is the id
        of the earliest such token of sequence seq_ids[i]. A block it fills becomes shareable.
        Raises ValueError for a sequence that is not live, is named twice or has no such token,
        or for token ids that are not one integer per sequence; nothing changes then."""
        seq_ids = as_list("seq_ids", seq_ids, "a sequence of seq ids")
        seqs = [self._seq(seq_id) for seq_id in seq_ids]
        token_ids = self._check_token_ids(token_ids, len(seqs))
        if len(set(seq_ids)) < len(seq_ids):
            raise ValueError(f"seq_ids={seq_ids!r:.80}: a sequence named twice")
        # (a sequence that gave up prefix sharing keeps no ids: nothing to record for it)
        bad = next((i for i, seq in enumerate(seqs)
                    if seq.token_ids is not None and not seq.unknown), None)
        if bad is not None:
            raise ValueError(f"seq_ids[{bad}]={seq_ids[bad]}: has no token placed without an id")
        for seq, token_id in zip(seqs, token_ids, strict=True):
            if seq.token_ids is not None:
                seq.unknown -= 1
                self._add_token_id(seq, token_id)

    def _add_token_id(self, seq: _Sequence, token_id: int) -> None:
        """The id of the sequence's earliest token without one; registers the block it fills."""
        seq.token_ids.append(token_id)
        if not len(seq.token_ids) % self.block_size:
            self._register_full_blocks(seq, first_block=len(seq.token_ids) // self.block_size - 1)

    def fork(self, seq_id: int) -> int:
        """A new sequence sharing every block of `seq_id`. Returns its id."""
        seq = self._seq(seq_id)
        _check_ids_known("seq_id", seq_id, seq)
        self.pool.share(seq.block_ids)
        token_ids = None if seq.token_ids is None else list(seq.token_ids)
        child_id = self._new_seq_id()
        self._seqs[child_id] = _Sequence(list(seq.block_ids), seq.num_tokens, token_ids)
        return child_id

    def free(self, seq_id: int) -> None:
        self.pool.free(self._seq(seq_id).block_ids)
        del self._seqs[seq_id]

    def _seq(self, seq_id: int) -> _Sequence:
        seq = self._seqs.get(seq_id) if is_int(seq_id) else None
        if seq is None:
            raise ValueError(
                f"seq_id={seq_id!r}: not a live sequence (never added, or already freed)"
            )
        return seq

    def _new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def _check_token_ids(self, token_ids, num_tokens: int) -> list[int] | None:
        """`token_ids` as a list of `num_tokens` plain ints, or None."""
        if token_ids is None:
            return None
        token_ids = as_list("token_ids", token_ids, "None or a sequence of integers")
        if len(token_ids) != num_tokens:
            raise ValueError(
                f"token_ids has {len(token_ids)} ids: must have one per token ({num_tokens})"
            )
        if all(type(t) is int for t in token_ids):  # NOTE: the common case, in one cheap pass
            return token_ids
        for i, token_id in enumerate(token_ids):
            if not is_int(token_id):
                raise ValueError(f"token_ids[{i}]={token_id!r}: must be an integer")
        return [int(t) for t in token_ids]

    def _block_key(self, token_ids: list[int], parent: int | None, index: int) -> tuple:
        bs = self.block_size
        return parent, tuple(token_ids[index * bs : (index + 1) * bs])

    def _match_prefix(self, token_ids: list[int]) -> list[int]:
        """The live blocks holding the longest run of this sequence's leading full blocks."""
        shared: list[int] = []
        for index in range(len(token_ids) // self.block_size):
            parent = shared[-1] if shared else None
            block_id = self.pool.lookup(self._block_key(token_ids, parent, index))
            if block_id is None:
                break
            shared.append(block_id)
        return shared

    def _register_full_blocks(self, seq: _Sequence, first_block: int) -> None:
        if seq.token_ids is None:
            return
        for index in range(first_block, len(seq.token_ids) // self.block_size):
            parent = seq.block_ids[index - 1] if index else None
            key = self._block_key(seq.token_ids, parent, index)
            self.pool.register(seq.block_ids[index], key)
