import contextlib

import numpy as np
import pytest
import torch
from factories import make_cache, make_kv, make_seq

from kvlab.cache import PagedKVCache, cache_shapes, paged_cache
from kvlab.cache.paged_cache import DoesNotFit, check_fits

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def assert_gather(cache, seq_id, k, v):
    got_k, got_v = cache.gather(seq_id)
    assert torch.equal(got_k, k)
    assert torch.equal(got_v, v)


def cache_state(cache):
    manager = cache.manager
    return (
        {s: (manager.block_table(s), manager.seq_len(s)) for s in manager.seq_ids},
        manager.pool.free_block_ids(),
        cache.k_cache.clone(),
        cache.v_cache.clone(),
    )


def assert_unchanged(cache, before):
    after = cache_state(cache)
    assert after[:2] == before[:2]
    assert torch.equal(after[2], before[2]) and torch.equal(after[3], before[3])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 112, 128, 256])
def test_layout_shapes(dtype, head_dim):
    x = 16 // torch.empty((), dtype=dtype).element_size()
    hnd = make_cache(num_blocks=3, block_size=8, head_dim=head_dim, dtype=dtype)
    vllm = make_cache(num_blocks=3, block_size=8, head_dim=head_dim, dtype=dtype, layout="vllm")
    assert hnd.k_cache.shape == hnd.v_cache.shape == (3, 2, 8, head_dim)
    assert vllm.k_cache.shape == (3, 2, head_dim // x, 8, x)
    assert vllm.v_cache.shape == (3, 2, head_dim, 8)
    shapes = cache_shapes(3, 8, 2, head_dim, dtype, "vllm")
    assert shapes == (vllm.k_cache.shape, vllm.v_cache.shape)


def test_vllm_layout_puts_each_value_where_vllm_expects_it():
    cache = make_cache(num_blocks=4, block_size=8, head_dim=64, dtype=torch.float16, layout="vllm")
    seq_id, k, v = make_seq(cache, 11)
    block = cache.manager.block_table(seq_id)[1]
    token, head, d = 9, 1, 37  # token 9 sits at offset 1 of the second block
    assert cache.k_cache[block, head, d // 8, 1, d % 8] == k[token, head, d]
    assert cache.v_cache[block, head, d, 1] == v[token, head, d]


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_gather_returns_what_was_written(layout, dtype, block_size):
    cache = make_cache(num_blocks=160, block_size=block_size, dtype=dtype, layout=layout)
    seqs = [make_seq(cache, n, seed=n) for n in (1, 17, 97)]
    seq_id, k, v = seqs[1]
    k2, v2 = make_kv(cache, 20, seed=5)
    cache.append(seq_id, k2, v2)
    seqs[1] = (seq_id, torch.cat([k, k2]), torch.cat([v, v2]))
    for seq_id, k, v in seqs:
        assert_gather(cache, seq_id, k, v)


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_fork_then_append_copies_on_write(layout):
    cache = make_cache(block_size=4, layout=layout)
    parent, k, v = make_seq(cache, 6)
    child = cache.fork(parent)
    assert cache.block_tables([parent]).tolist() == cache.block_tables([child]).tolist()
    kc, vc = make_kv(cache, 3, seed=1)
    kp, vp = make_kv(cache, 1, seed=2)
    cache.append(child, kc, vc)
    cache.append(parent, kp, vp)
    assert_gather(cache, child, torch.cat([k, kc]), torch.cat([v, vc]))
    assert_gather(cache, parent, torch.cat([k, kp]), torch.cat([v, vp]))
    assert cache.block_tables([parent])[0, 0] == cache.block_tables([child])[0, 0]


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_layers_sharing_a_manager_write_what_their_own_appends_would(layout):
    """Two caches on one BlockManager (an engine's layers): placed once, each written with
    write/write_slots and copy_blocks, both hold what add_sequence and append store, through a
    fork's copy-on-write."""
    first = make_cache(block_size=4, layout=layout)
    second = PagedKVCache(64, 4, first.num_kv_heads, first.head_dim, first.dtype,
                          layout=layout, manager=first.manager)
    k, v = make_kv(first, 6)
    alloc = first.manager.add_sequence(6)
    first.write(alloc, k, v)
    second.write(alloc, 2 * k, 2 * v)
    child = first.manager.fork(alloc.seq_id)
    kn, vn = make_kv(first, 1, seed=4)
    step = first.manager.append(child, 1)
    slots = torch.tensor(first.manager.slot_mapping(child, 6, 7))
    for cache, scale in ((first, 1), (second, 2)):
        cache.copy_blocks(step.copies)
        cache.write_slots(slots, scale * kn, scale * vn)
        assert_gather(cache, child, scale * torch.cat([k, kn]), scale * torch.cat([v, vn]))
        assert_gather(cache, alloc.seq_id, scale * k, scale * v)
    assert step.copies  # the child's append copied the shared partial block
    with pytest.raises(ValueError, match="slots: int64 \\[1\\]"):
        second.write_slots(slots.int(), kn, vn)
    with pytest.raises(ValueError, match="manager=.*must be a BlockManager of num_blocks=32"):
        PagedKVCache(32, 4, 2, 64, manager=first.manager)


def test_shared_prefix_blocks_are_not_rewritten():
    cache = make_cache(block_size=4)
    a, k, v = make_seq(cache, 9, token_ids=range(9))
    kb, vb = make_kv(cache, 10, seed=3)
    kb[:8], vb[:8] = k[:8], v[:8]  # same tokens, same prefix K/V
    b = cache.add_sequence(kb, vb, token_ids=range(10))
    assert cache.num_free_blocks == 64 - 3 - 1
    assert_gather(cache, a, k, v)
    assert_gather(cache, b, kb, vb)


def test_block_tables_and_seq_lens_are_padded_int32():
    cache = make_cache(block_size=4)
    a, _, _ = make_seq(cache, 9)
    b, _, _ = make_seq(cache, 2)
    tables, lens = cache.block_tables([a, b]), cache.seq_lens([a, b])
    assert tables.dtype == lens.dtype == torch.int32
    assert tables.tolist() == [cache.manager.block_table(a), cache.manager.block_table(b) + [0, 0]]
    assert lens.tolist() == [9, 2]
    assert cache.block_tables([]).shape == (0, 0)


def test_append_zero_tokens_is_a_no_op():
    cache = make_cache()
    seq_id, k, v = make_seq(cache, 5)
    cache.append(seq_id, *make_kv(cache, 0))
    assert_gather(cache, seq_id, k, v)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_size": 48}, r"block_size=48: must be a power of two in \[1, 256\]"),
        ({"head_dim": 100},
         r"head_dim=100: must be an integer, one of \(64, 80, 96, 112, 128, 256\)"),
        ({"head_dim": 64.0}, r"head_dim=64.0: must be an integer, one of"),
        ({"dtype": torch.float64}, r"dtype=torch.float64: must be one of"),
        ({"dtype": torch.int8}, r"dtype=torch.int8: must be one of"),
        ({"layout": "nhd"}, r"layout='nhd': must be one of \('hnd', 'vllm'\)"),
        ({"num_kv_heads": 0}, r"num_kv_heads=0: must be an integer >= 1"),
        ({"num_kv_heads": 2.0}, r"num_kv_heads=2.0: must be an integer >= 1"),
        ({"num_blocks": 0}, r"num_blocks=0: must be an integer >= 1"),
        ({"device": "bogus"}, r"device='bogus': must be a torch device"),
        ({"device": "cuda:99"}, r"device=cuda:99: no such CUDA device"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_cache(**kwargs)


def test_a_cache_larger_than_memory_is_refused_before_allocating():
    with pytest.raises(ValueError, match=r"num_blocks=1099511627776: the K/V tensors need "
                                         r"72,057,594,037,927,936 bytes, but cpu has"):
        PagedKVCache(2**40, 16, 8, 128)


def test_a_failed_allocation_is_a_value_error(monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "zeros", out_of_memory)
    with pytest.raises(ValueError, match="num_blocks=8: could not allocate the K/V tensors on "
                                         "cpu: CUDA out of memory") as err:
        make_cache(num_blocks=8)
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)


def test_block_copies_must_name_blocks_of_the_cache():
    """A negative id copied into the last block silently; one past the end was torch's
    IndexError."""
    cache = make_cache(num_blocks=8, block_size=4)
    seq_id, k, v = make_seq(cache, 5)
    before = cache_state(cache)
    for copies, message in [([(0, -1)], r"copies\[0\]=\(0, -1\)"),
                            ([(0, 1), (8, 2)], r"copies\[1\]=\(8, 2\)"),
                            ([(0, True)], r"copies\[0\]=\(0, True\)"),
                            ([(0, 1.0)], r"copies\[0\]=\(0, 1.0\)"),
                            ([(0, 1, 2)], r"copies\[0\]=\(0, 1, 2\)"),
                            ([5], r"copies\[0\]=5")]:
        with pytest.raises(ValueError, match=message + r": must be a \(src_block_id, "
                                                       r"dst_block_id\) pair of block ids, "
                                                       r"integers in \[0, 8\)"):
            cache.copy_blocks(copies)
        assert_unchanged(cache, before)
    cache.copy_blocks(iter([(np.int64(0), 7)]))
    torch.testing.assert_close(cache.k_cache[7], cache.k_cache[0])


def test_seq_ids_that_are_not_a_sequence_or_an_allocation_are_refused_by_name():
    cache = make_cache(num_blocks=8)
    for call in (cache.block_tables, cache.seq_lens):
        with pytest.raises(ValueError, match="seq_ids=3: must be a sequence of seq ids"):
            call(3)
    with pytest.raises(ValueError, match="alloc=0: must be an Allocation"):
        cache.write(0, *make_kv(cache, 1))


def test_cache_shapes_refuses_an_unknown_layout():
    with pytest.raises(ValueError, match=r"layout='bogus': must be one of \('hnd', 'vllm'\)"):
        cache_shapes(3, 8, 2, 64, torch.float16, "bogus")


def test_numpy_sizes_are_stored_as_ints():
    cache = PagedKVCache(np.int64(8), np.int64(4), np.int32(2), np.int64(64), seed=np.int64(0))
    sizes = (cache.num_blocks, cache.block_size, cache.num_kv_heads, cache.head_dim,
             cache.manager.block_size, cache.manager.num_blocks)
    assert sizes == (8, 4, 2, 64, 4, 8) and all(type(n) is int for n in sizes)


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_writes_of_kv_that_require_grad_stay_out_of_autograd(layout):
    cache = make_cache(block_size=4, layout=layout)
    k, v = make_kv(cache, 6)
    seq_id = cache.add_sequence(k.requires_grad_(), v.requires_grad_())
    child = cache.fork(seq_id)
    cache.append(child, *(t.requires_grad_() for t in make_kv(cache, 1, seed=1)))  # copy-on-write
    for t in (cache.k_cache, cache.v_cache):
        assert not t.requires_grad and t.grad_fn is None
    assert_gather(cache, seq_id, k.detach(), v.detach())


def test_bad_kv_is_rejected_and_leaves_the_cache_unchanged():
    cache = make_cache(num_blocks=8, block_size=4)
    seq_id, k, v = make_seq(cache, 5)
    before = cache_state(cache)
    good_k, good_v = make_kv(cache, 3)
    bad = [
        ((good_k[:, :1], good_v[:, :1]), r"k.shape=\(3, 1, 64\): must be \[n, num_kv_heads=2"),
        ((good_k, good_v[:2]), r"v.shape=\(2, 2, 64\)"),  # caught as a mismatch with k
        ((good_k.half(), good_v.half()), r"k.dtype=torch.float16: must be the cache's"),
        ((good_k.numpy(), good_v), r"k: must be a torch.Tensor, got ndarray"),
        ((good_k[0], good_v[0]), r"k.shape=\(2, 64\)"),
        ((good_k.to("meta"), good_v.to("meta")), r"k.device=meta: must be the cache's cpu"),
    ]
    for (bk, bv), message in bad:
        with pytest.raises(ValueError, match=message):
            cache.append(seq_id, bk, bv)
        with pytest.raises(ValueError, match=message):
            cache.add_sequence(bk, bv)
        assert_unchanged(cache, before)
    with pytest.raises(ValueError, match="k has 0 tokens"):
        cache.add_sequence(*make_kv(cache, 0))
    with pytest.raises(ValueError, match="token_ids has 2 ids"):
        cache.add_sequence(good_k, good_v, token_ids=[1, 2])
    with pytest.raises(ValueError, match=r"token_ids\[1\]=1.5: must be an integer"):
        cache.append(seq_id, good_k, good_v, token_ids=[1, 1.5, 2])
    assert_unchanged(cache, before)


def test_out_of_blocks_leaves_the_cache_unchanged():
    from kvlab.cache import OutOfBlocksError

    cache = make_cache(num_blocks=3, block_size=4)
    seq_id, _, _ = make_seq(cache, 6)
    before = cache_state(cache)
    with pytest.raises(OutOfBlocksError):
        cache.append(seq_id, *make_kv(cache, 7))
    with pytest.raises(OutOfBlocksError):
        make_seq(cache, 5)
    assert_unchanged(cache, before)


@pytest.mark.parametrize("seq_id", [7, None])
def test_unknown_or_freed_seq_id(seq_id):
    cache = make_cache()
    live, _, _ = make_seq(cache, 3)
    cache.free(live)
    for bad in (seq_id, live):
        for call in (cache.gather, cache.free, cache.fork,
                     lambda s: cache.block_tables([s]), lambda s: cache.seq_lens([s]),
                     lambda s: cache.append(s, *make_kv(cache, 1))):
            with pytest.raises(ValueError, match=f"seq_id={bad!r}: not a live sequence"):
                call(bad)


def test_repr_and_nbytes():
    cache = PagedKVCache(10, 16, 2, 64, dtype=torch.float16)
    assert cache.nbytes == 2 * 10 * 2 * 16 * 64 * 2
    assert "num_free_blocks=10" in repr(cache)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_on_cuda(layout):
    cache = make_cache(layout=layout, dtype=torch.float16, device="cuda")
    seq_id, k, v = make_seq(cache, 37)
    assert_gather(cache, seq_id, k, v)
    assert cache.block_tables([seq_id]).device.type == "cuda"


@pytest.mark.gpu
def test_a_cache_larger_than_the_gpu_is_refused_before_allocating():
    free_before = torch.cuda.mem_get_info()[0]
    with pytest.raises(ValueError, match=r"num_blocks=1099511627776: the K/V tensors need "
                                         r"72,057,594,037,927,936 bytes, but cuda has"):
        PagedKVCache(2**40, 16, 8, 128, device="cuda")
    assert torch.cuda.mem_get_info()[0] >= free_before


def test_a_gpu_counts_as_free_what_its_driver_has_once_the_allocator_gave_back_what_it_can(
        monkeypatch):
    """torch's allocator first hands back the segments it holds unused; what it holds unused
    inside segments still in use (here 800 bytes) is not counted."""
    calls = []
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info",
                        lambda device: calls.append("mem_get_info") or (1000, 5000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 900)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 100)
    assert paged_cache._free_bytes(torch.device("cuda:0")) == 1000
    assert calls == ["empty_cache", "mem_get_info"]
    with pytest.raises(DoesNotFit, match=r"^x need 1,001 bytes, but cuda:0 has 1,000 bytes free"):
        check_fits("x", 1001, torch.device("cuda:0"))


@pytest.mark.gpu
def test_pieces_the_allocator_keeps_inside_live_segments_are_not_counted_free():
    """Every other one of 512 tensors of 2 MiB freed: torch's allocator keeps 512 MiB unused, in
    2 MiB pieces inside its 20 MiB segments still in use, where no larger tensor fits. A check
    that counted them let a cache through that then ran out of memory."""
    torch.cuda.empty_cache()
    tensors = [torch.empty(2 << 20, dtype=torch.uint8, device="cuda") for _ in range(512)]
    del tensors[::2]
    torch.cuda.empty_cache()
    pieces = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    assert pieces >= 256 << 20  # the pieces are there, with torch's default allocator settings
    free = torch.cuda.mem_get_info()[0]
    with pytest.raises(DoesNotFit):
        check_fits("pieces", free + pieces // 2, torch.device("cuda"))
    del tensors
    # a segment held whole and unused is handed back, and counted
    held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    del held
    free = torch.cuda.mem_get_info()[0]
    assert torch.cuda.memory_reserved() >= 1 << 30
    check_fits("a segment held unused", free + (512 << 20), torch.device("cuda"))


@pytest.mark.parametrize("bad", [-1, 32, 2**40])
def test_slots_outside_the_cache_are_refused_before_writing(bad):
    """An index past the end was torch's IndexError on the CPU, a device assert on a GPU."""
    cache = make_cache(num_blocks=8, block_size=4)
    before = cache_state(cache)
    k = torch.ones(2, cache.num_kv_heads, cache.head_dim, dtype=cache.dtype)
    with pytest.raises(ValueError, match=rf"slots: holds {bad}, must be in \[0, num_blocks x "
                                         r"block_size = 32\)"):
        cache.write_slots(torch.tensor([0, bad]), k, k)
    assert_unchanged(cache, before)
    cache.write_slots(torch.tensor([0, 31]), k, k)
    assert torch.equal(cache_state(cache)[2].count_nonzero(), torch.tensor(2 * k[0].numel()))


def test_writes_of_the_wrong_kind_or_too_few_tokens_are_refused_before_writing():
    """Too few tokens for what the manager placed was torch's broadcast error; slots as a list
    and copies as a number were AttributeError and TypeError."""
    cache = make_cache(num_blocks=8, block_size=4)
    alloc = cache.manager.add_sequence(10)
    before = cache_state(cache)
    for n in (0, 5, 9):
        k, v = make_kv(cache, n)
        with pytest.raises(ValueError, match=f"k has {n} tokens: sequence {alloc.seq_id}'s "
                                             "positions 0 to 9 must be written, its last 10"):
            cache.write(alloc, k, v)
    k, v = make_kv(cache, 1)
    with pytest.raises(ValueError, match=r"slots=\[0\]: must be an int64 tensor \[1\]"):
        cache.write_slots([0], k, v)
    with pytest.raises(ValueError, match="copies=5: must be a sequence of"):
        cache.copy_blocks(5)
    assert_unchanged(cache, before)
    k, v = make_kv(cache, 10)
    cache.write(alloc, k, v)
    assert_gather(cache, alloc.seq_id, k, v)
