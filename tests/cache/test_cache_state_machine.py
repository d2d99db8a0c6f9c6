"""Random add / append / fork / free sequences against a dense model of what each sequence holds."""

import collections

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvlab.cache import OutOfBlocksError, PagedKVCache

NUM_BLOCKS, NUM_KV_HEADS, HEAD_DIM = 24, 2, 64
ROW = torch.arange(2 * NUM_KV_HEADS * HEAD_DIM, dtype=torch.float32)[None]  # one token's K and V
TOKENS = st.lists(st.integers(0, 1), min_size=0, max_size=14)  # tiny alphabet: prefixes collide


def kv_of_prefix(token_ids: list[int], start: int, stop: int):
    """K, V for positions [start, stop) of a token sequence: a function of the whole prefix, so that
    sequences with equal prefixes agree on K/V (which prefix sharing assumes)."""
    rows, state = [ROW[:0]], 17
    for pos, token in enumerate(token_ids[:stop]):
        state = (state * 31 + token + 1) % 1_000_003
        if pos >= start:
            rows.append(ROW + state)
    kv = torch.cat(rows).view(stop - start, 2, NUM_KV_HEADS, HEAD_DIM)
    return kv[:, 0], kv[:, 1]


class CacheMachine(RuleBasedStateMachine):
    @initialize(block_size=st.sampled_from([1, 2, 4, 8]), layout=st.sampled_from(["hnd", "vllm"]))
    def make_cache(self, block_size, layout):
        self.cache = PagedKVCache(NUM_BLOCKS, block_size, NUM_KV_HEADS, HEAD_DIM,
                                  dtype=torch.float32, layout=layout)
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}
        self.tokens: dict[int, list[int] | None] = {}
        self.num_random = 0

    def _random_kv(self, n):
        gen = torch.Generator().manual_seed(self.num_random)
        self.num_random += 1
        return (torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen),
                torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen))

    @rule(tokens=TOKENS.filter(len), with_ids=st.booleans())
    def add(self, tokens, with_ids):
        k, v = kv_of_prefix(tokens, 0, len(tokens)) if with_ids else self._random_kv(len(tokens))
        try:
            seq_id = self.cache.add_sequence(k, v, token_ids=tokens if with_ids else None)
        except OutOfBlocksError:
            return
        self.k[seq_id], self.v[seq_id] = k, v
        self.tokens[seq_id] = list(tokens) if with_ids else None

    @precondition(lambda self: self.k)
    @rule(data=st.data(), tokens=TOKENS, with_ids=st.booleans())
    def append(self, data, tokens, with_ids):
        seq_id = data.draw(st.sampled_from(sorted(self.k)))
        known = self.tokens[seq_id]
        if with_ids and known is not None:
            full = known + tokens
            k, v = kv_of_prefix(full, len(known), len(full))
        else:
            k, v = self._random_kv(len(tokens))
        try:
            self.cache.append(seq_id, k, v, token_ids=tokens if with_ids else None)
        except OutOfBlocksError:
            return
        self.k[seq_id] = torch.cat([self.k[seq_id], k])
        self.v[seq_id] = torch.cat([self.v[seq_id], v])
        if tokens:
            self.tokens[seq_id] = full if with_ids and known is not None else None

    @precondition(lambda self: self.k)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(self.k)))
        child = self.cache.fork(parent)
        self.k[child], self.v[child] = self.k[parent], self.v[parent]
        known = self.tokens[parent]
        self.tokens[child] = None if known is None else list(known)

    @precondition(lambda self: self.k)
    @rule(data=st.data())
    def free(self, data):
        seq_id = data.draw(st.sampled_from(sorted(self.k)))
        self.cache.free(seq_id)
        del self.k[seq_id], self.v[seq_id], self.tokens[seq_id]

    @rule(data=st.data())
    def bad_call(self, data):
        """A call with a bad argument raises ValueError and leaves the cache exactly as it was;
        lists of block ids start with good ids, so a check made id by id would change those."""
        manager = self.cache.manager
        pool = manager.pool
        used = sorted({b for s in manager.seq_ids for b in manager.block_table(s)})
        free = pool.free_block_ids()
        calls = [
            lambda: pool.allocate(-1),
            lambda: pool.free([*used, -1]),
            lambda: pool.free([*used, NUM_BLOCKS]),
            lambda: pool.share([*used, True]),
            lambda: self.cache.add_sequence(*self._random_kv(2), token_ids=[0, 0.5]),
        ]
        if free:
            calls += [
                lambda: pool.free([*used, free[0]]),
                lambda: pool.share([*used, free[0]]),
                lambda: pool.register(free[0], "key"),
            ]
        if used:
            calls.append(lambda: pool.free(used + [used[-1]] * pool.ref_cnt(used[-1])))
        if self.k:
            seq_id = data.draw(st.sampled_from(sorted(self.k)))
            seq_len = manager.seq_len(seq_id)
            calls += [
                lambda: self.cache.append(seq_id, *self._random_kv(1), token_ids=[1.0]),
                lambda: manager.slot_mapping(seq_id, 0, seq_len + 1),
                lambda: manager.slot_mapping(seq_id, -1, seq_len),
            ]
        before = self._state()
        with pytest.raises(ValueError):
            data.draw(st.sampled_from(calls))()
        after = self._state()
        assert after[:3] == before[:3]
        assert torch.equal(after[3], before[3]) and torch.equal(after[4], before[4])

    def _state(self):
        manager = self.cache.manager
        return (
            {s: manager.block_table(s) for s in manager.seq_ids},
            manager.pool.free_block_ids(),
            [manager.pool.ref_cnt(b) for b in range(NUM_BLOCKS)],
            self.cache.k_cache.clone(),
            self.cache.v_cache.clone(),
        )

    @invariant()
    def no_block_is_both_free_and_in_use(self):
        manager = self.cache.manager
        free = manager.pool.free_block_ids()
        used = {b for s in manager.seq_ids for b in manager.block_table(s)}
        assert len(free) == len(set(free))
        assert not used & set(free)
        assert used | set(free) == set(range(NUM_BLOCKS))

    @invariant()
    def ref_cnt_counts_the_tables_holding_each_block(self):
        manager = self.cache.manager
        holders = collections.Counter(b for s in manager.seq_ids for b in manager.block_table(s))
        assert [manager.pool.ref_cnt(b) for b in range(NUM_BLOCKS)] == [
            holders[b] for b in range(NUM_BLOCKS)
        ]

    @invariant()
    def gather_returns_what_was_written(self):
        assert sorted(self.cache.seq_ids) == sorted(self.k)
        for seq_id in self.k:
            k, v = self.cache.gather(seq_id)
            assert torch.equal(k, self.k[seq_id]) and torch.equal(v, self.v[seq_id])

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for seq_id in list(self.k):
            self.cache.free(seq_id)
        assert self.cache.num_free_blocks == NUM_BLOCKS


CacheMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_cache_state_machine = CacheMachine.TestCase
