"""The fp8 (e4m3) paged cache on the CPU: per-head scales, saturation, copy-on-write, and the
accuracy of the reference decode against the same data in fp16.

Per-element bound (kvlab.cache.fp8): |read - written| <= 2**-4 |written| inside e4m3's normal
range (3 mantissa bits, round to nearest), <= 2**-10 * scale below it (subnormal spacing 2**-9).
"""

import types

import pytest
import torch
from factories import make_cache

from kvlab.cache import PagedKVCache
from kvlab.cache.fp8 import E4M3_MAX
from kvlab.kernels.decode import _check_cache
from kvlab.reference import decode_attention

FP8 = torch.float8_e4m3fn


def make_fp8_cache(**kwargs) -> PagedKVCache:
    return make_cache(dtype=FP8, **kwargs)


def make_kv16(cache: PagedKVCache, seq_len: int, seed: int = 0, outliers: int = 0):
    """Random fp16 (k, v), each [seq_len, num_kv_heads, head_dim]; `outliers` channels of K (the
    first ones of every head) 20x larger, like the outlier channels of real models' K."""
    gen = torch.Generator().manual_seed(seed)
    shape = (seq_len, cache.num_kv_heads, cache.head_dim)
    k, v = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    k[..., :outliers] *= 20
    return k.half(), v.half()


def assert_within_e4m3(got, want, scale):
    """got, want: [n, num_kv_heads, head_dim]; scale: [num_kv_heads]."""
    want = want.float()
    bound = 2**-4 * want.abs() * (1 + 1e-6) + 2**-10 * scale[:, None]
    assert got.dtype == torch.float32
    assert ((got - want).abs() <= bound).all()


def fp8_state(cache):
    manager = cache.manager
    return (
        {s: (manager.block_table(s), manager.seq_len(s)) for s in manager.seq_ids},
        manager.pool.free_block_ids(),
        cache.saturated,
        cache.k_scale.tolist(),
        cache.v_scale.tolist(),
        cache.k_cache.view(torch.uint8).clone(),  # bytes: torch.equal lacks float8 on the CPU
        cache.v_cache.view(torch.uint8).clone(),
    )


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("source", [torch.float16, torch.bfloat16, torch.float32])
def test_round_trip_within_the_e4m3_bound(layout, source):
    cache = make_fp8_cache(num_blocks=32, block_size=16, head_dim=128, layout=layout)
    k, v = (t.to(source) for t in make_kv16(cache, 97))
    seq_id = cache.add_sequence(k, v)
    got_k, got_v = cache.gather(seq_id)
    assert_within_e4m3(got_k, k, cache.k_scale)
    assert_within_e4m3(got_v, v, cache.v_scale)
    assert cache.saturated == 0


def test_vllm_layout_is_16_values_per_vector_and_holds_the_same_values_as_hnd():
    hnd = make_fp8_cache(num_blocks=8, block_size=8, head_dim=80)
    vllm = make_fp8_cache(num_blocks=8, block_size=8, head_dim=80, layout="vllm")
    assert vllm.k_cache.shape == (8, 2, 80 // 16, 8, 16)
    assert vllm.v_cache.shape == (8, 2, 80, 8)
    k, v = make_kv16(hnd, 21)
    a, b = hnd.add_sequence(k, v), vllm.add_sequence(k, v)
    for x, y in zip(hnd.gather(a), vllm.gather(b), strict=True):
        assert torch.equal(x, y)


def test_scale_is_set_by_the_first_nonzero_write_of_each_head_then_fixed():
    cache = make_fp8_cache(num_kv_heads=3)
    k = torch.zeros(5, 3, 64, dtype=torch.float16)
    k[2, 0, 7] = -3.5  # head 0 gets a value, heads 1 and 2 stay zero
    seq_id = cache.add_sequence(k, torch.zeros_like(k))
    assert cache.k_scale.tolist() == pytest.approx([3.5 / E4M3_MAX, 1.0, 1.0])
    assert cache.v_scale.tolist() == [1.0, 1.0, 1.0]
    k2 = torch.full((2, 3, 64), 0.25, dtype=torch.float16)
    cache.append(seq_id, k2, k2)
    scales = cache.k_scale.tolist(), cache.v_scale.tolist()
    assert scales == (pytest.approx([3.5 / E4M3_MAX] + [0.25 / E4M3_MAX] * 2),
                      pytest.approx([0.25 / E4M3_MAX] * 3))
    cache.append(seq_id, k2 / 2, k2 * 2)  # smaller or larger: the scales do not move
    assert (cache.k_scale.tolist(), cache.v_scale.tolist()) == scales
    assert cache.gather(seq_id)[0][2, 0, 7] == pytest.approx(-3.5)  # amax is stored as -448


def test_values_past_the_first_writes_range_are_clamped_and_counted():
    cache = make_fp8_cache(num_kv_heads=1)
    seq_id = cache.add_sequence(torch.ones(1, 1, 64), torch.ones(1, 1, 64))
    assert cache.saturated == 0
    k = torch.ones(3, 1, 64)
    k[0, 0, :5] = 10.0
    k[1, 0, 0] = -1e30  # beyond fp16 too: the fp32 input still comes back as -1 * 448 * scale
    cache.append(seq_id, k, torch.ones(3, 1, 64))
    assert cache.saturated == 6
    got_k, got_v = cache.gather(seq_id)
    assert torch.isfinite(got_k).all() and torch.isfinite(got_v).all()
    assert got_k[1, 0, :5].tolist() == [1.0] * 5 and got_k[2, 0, 0] == -1.0


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_append_fork_and_copy_on_write_match_an_fp32_cache(layout):
    caches = [make_cache(block_size=4, head_dim=128, dtype=dtype, layout=layout)
              for dtype in (FP8, torch.float32)]
    parts = [make_kv16(caches[0], n, seed=n) for n in (6, 3, 1, 9)]
    for t in parts[0]:
        t[0, :, 0] = 8.0  # the first write sets scales that no later randn value exceeds
    for cache in caches:
        to = torch.float32 if cache.dtype == torch.float32 else torch.float16
        k, v = (t.to(to) for t in parts[0])
        parent = cache.add_sequence(k, v)
        child = cache.fork(parent)
        cache.append(child, *(t.to(to) for t in parts[1]))
        cache.append(parent, *(t.to(to) for t in parts[2]))
        other = cache.fork(child)
        cache.free(child)
        cache.append(other, *(t.to(to) for t in parts[3]))
    fp8_cache, fp32_cache = caches
    assert fp8_cache.saturated == 0
    assert fp8_cache.manager.seq_ids == fp32_cache.manager.seq_ids == [parent, other]
    for seq_id in (parent, other):
        for got, want, scale in zip(fp8_cache.gather(seq_id), fp32_cache.gather(seq_id),
                                    (fp8_cache.k_scale, fp8_cache.v_scale), strict=True):
            assert_within_e4m3(got, want, scale)


@pytest.mark.parametrize("bad", [torch.float64, torch.int32, FP8])
@pytest.mark.parametrize("name", ["k", "v"])
def test_bad_input_dtypes_are_refused_before_any_change(bad, name):
    cache = make_fp8_cache()
    seq_id = cache.add_sequence(*make_kv16(cache, 5))
    before = fp8_state(cache)
    k, v = make_kv16(cache, 3, seed=1)
    kv = {"k": k, "v": v}
    kv[name] = kv[name].to(bad)
    for call in (lambda: cache.add_sequence(**kv), lambda: cache.append(seq_id, **kv)):
        with pytest.raises(ValueError, match=rf"{name}.dtype={bad}: an fp8 cache is written from"):
            call()
    after = fp8_state(cache)
    assert after[:5] == before[:5]
    assert torch.equal(after[5], before[5]) and torch.equal(after[6], before[6])


def test_non_finite_input_is_refused():
    cache = make_fp8_cache()
    k, v = make_kv16(cache, 3)
    k[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="k: holds NaN or inf"):
        cache.add_sequence(k, v)
    assert cache.seq_ids == [] and cache.k_scale.tolist() == [1.0, 1.0]


def test_other_dtypes_have_no_scales():
    cache = make_cache(dtype=torch.float16)
    assert cache.k_scale is None and cache.v_scale is None and cache.saturated == 0


def test_the_cuda_kernels_take_an_fp8_cache_and_refuse_fp32():
    """fp8 is read by gqa (vllm_v1's refusal: tests/kernels/test_gqa_fp8.py); fp32 by neither."""
    _check_cache(types.SimpleNamespace(device=torch.device("cuda", 0), dtype=FP8))
    cuda_fp32 = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"cache.dtype=torch.float32: the CUDA kernels support "
                                         r"\(torch.float16, torch.bfloat16, torch.float8_e4m3fn\)"):
        _check_cache(cuda_fp32)


def rel_l2(got, want):
    """||got - want|| / ||want|| per row (sequence, query head) of [B, num_qo_heads, head_dim]."""
    return (got - want).norm(dim=-1) / want.norm(dim=-1)


# NOTE: the bounds are the measured CPU-reference errors (printed with -s) with ~1.5x headroom.
# Outlier channels of K cost accuracy whatever the scale: e4m3 keeps 2**-4 relative per element,
# so a channel 20x larger carries a 20x larger error into the logits (~0.4 at head_dim=128).
@pytest.mark.parametrize(("kind", "outliers", "bound"), [("random", 0, 0.09),
                                                         ("outlier", 4, 0.9)])
@pytest.mark.parametrize("seq_len", [1, 17, 97, 1000])
def test_decode_accuracy_against_fp16(kind, outliers, bound, seq_len):
    num_kv_heads, group, head_dim = 2, 4, 128
    caches = [make_cache(num_blocks=4 * 64, block_size=16, num_kv_heads=num_kv_heads,
                         head_dim=head_dim, dtype=dtype) for dtype in (FP8, torch.float16)]
    seq_ids = []
    for b in range(4):
        k, v = make_kv16(caches[0], seq_len, seed=b, outliers=outliers)
        seq_ids.append([cache.add_sequence(k, v) for cache in caches][0])
    q = torch.randn(4, num_kv_heads * group, head_dim, generator=torch.Generator().manual_seed(9))
    got, want = (decode_attention(q.half(), cache, seq_ids) for cache in caches)
    error = rel_l2(got, want)
    print(f"\nfp8 vs fp16, {kind} K, seq_len={seq_len}, GQA 4:1, head_dim=128: rel L2 max "
          f"{error.max():.4f}, mean {error.mean():.4f}")
    assert error.max() < bound
