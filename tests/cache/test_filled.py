"""filled_cache: random K/V, every sequence whole, siblings sharing their prefix blocks, blocks
scattered or in order (CPU)."""

import re

import pytest
import torch

from kvlab.cache import filled_cache


def test_sequences_and_siblings_share_blocks():
    cache, seq_ids, sibling_ids = filled_cache(3, 40, 8, 2, 64, layout="hnd",
                                               dtype=torch.float32, device="cpu", sibling=24)
    assert len(seq_ids) == len(sibling_ids) == 3
    tables = cache.manager
    for seq_id, sibling_id in zip(seq_ids, sibling_ids, strict=True):
        table, sibling_table = tables.block_table(seq_id), tables.block_table(sibling_id)
        assert len(table) == 5 and sibling_table == table[:3]
    assert cache.manager.num_free_blocks == 0  # siblings took no new block
    assert cache.k_cache.std() > 0.5 and cache.v_cache.std() > 0.5


@pytest.mark.parametrize("sibling", [20, 40, 48, 0, True])
def test_sibling_must_be_whole_blocks_short_of_the_context(sibling):
    with pytest.raises(ValueError, match=f"sibling={sibling!r}: must be a multiple of block_size"):
        filled_cache(1, 40, 8, 1, 64, layout="hnd", dtype=torch.float32, device="cpu",
                     sibling=sibling)


def test_an_fp8_cache_is_filled_with_normal_values_in_range():
    cache, seq_ids, _ = filled_cache(2, 40, 8, 2, 64, layout="hnd", dtype=torch.float8_e4m3fn,
                                     device="cpu")
    k, v = (t.float() for t in (cache.k_cache, cache.v_cache))
    assert torch.isfinite(k).all() and torch.isfinite(v).all()
    assert 0.9 < k.std().item() < 1.1 and abs(v.mean().item()) < 0.05
    assert torch.equal(cache.k_scale, torch.ones(2)) and cache.saturated == 0


@pytest.mark.parametrize("context", [40, [40, 7, 17]])
def test_blocks_are_scattered_unless_asked_in_order(context):
    def tables(**kw):
        cache, seq_ids, _ = filled_cache(3, context, 8, 2, 64, layout="hnd", dtype=torch.float32,
                                         device="cpu", **kw)
        return [cache.manager.block_table(s) for s in seq_ids]

    ordered = tables(in_order=True)
    # one run of ids a sequence, the sequences one after another
    assert sum(ordered, []) == list(range(sum(map(len, ordered))))
    scattered = tables()
    assert sorted(sum(scattered, [])) == sum(ordered, []) != sum(scattered, [])
    assert tables() == scattered  # seeded: the same tables every time


def test_a_batch_of_mixed_lengths():
    cache, seq_ids, _ = filled_cache(3, [40, 7, 17], 8, 2, 64, layout="hnd",
                                     dtype=torch.float32, device="cpu")
    assert [cache.manager.seq_len(s) for s in seq_ids] == [40, 7, 17]
    assert cache.manager.num_free_blocks == 0  # 5 + 1 + 3 blocks, no more


@pytest.mark.parametrize(("context", "sibling", "message"), [
    ([40, 7], None, "context=[40, 7]: must be an int >= 1 or 3 ints >= 1"),
    ([40, 0, 8], None, "context=[40, 0, 8]: must be an int >= 1 or 3 ints >= 1"),
    ([40, 40, 40], 8, "sibling=8: must be a multiple of block_size=8"),
])
def test_mixed_lengths_are_checked(context, sibling, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        filled_cache(3, context, 8, 1, 64, layout="hnd", dtype=torch.float32, device="cpu",
                     sibling=sibling)
