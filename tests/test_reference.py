import numpy as np
import pytest
import torch
import torch.nn.functional as F
from factories import make_cache, make_seq

from kvlab.reference import decode_attention


def sdpa_on_gathered(q, cache, seq_ids, scale=None):
    """torch SDPA per sequence on the dense K/V that `gather` returns, in fp32."""
    outs = []
    for b, seq_id in enumerate(seq_ids):
        k, v = cache.gather(seq_id)  # [n, H, D]
        out = F.scaled_dot_product_attention(
            q[b, :, None].float()[None],  # [1, Hq, 1, D]
            k.float().transpose(0, 1)[None],  # [1, H, n, D]
            v.float().transpose(0, 1)[None],
            scale=scale,
            enable_gqa=True,
        )
        outs.append(out[0, :, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", range(1, 9))
def test_equals_sdpa_on_gathered_kv(layout, dtype, group):
    num_kv_heads = 2
    cache = make_cache(num_blocks=32, block_size=16, num_kv_heads=num_kv_heads, head_dim=64,
                       dtype=dtype, layout=layout)
    seq_ids = [make_seq(cache, n, seed=n)[0] for n in (1, 17, 97)]
    q = torch.randn(3, num_kv_heads * group, 64).to(dtype)
    got = decode_attention(q, cache, seq_ids)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, sdpa_on_gathered(q, cache, seq_ids), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("group", [1, 4])
def test_fp8_cache_is_dequantised_per_kv_head(layout, group):
    cache = make_cache(num_blocks=32, block_size=16, head_dim=64, dtype=torch.float8_e4m3fn,
                       layout=layout)
    head_sizes = torch.tensor([3.0, 0.01])[:, None]  # KV heads 0 and 1: far apart scales
    seq_ids = [cache.add_sequence(*(t.half() * head_sizes for t in torch.randn(2, n, 2, 64)))
               for n in (1, 17, 97)]
    assert cache.k_scale[0] > 100 * cache.k_scale[1]
    q = torch.randn(3, 2 * group, 64)
    got = decode_attention(q, cache, seq_ids)
    assert got.dtype == torch.float32 and got.shape == q.shape
    torch.testing.assert_close(got, sdpa_on_gathered(q, cache, seq_ids), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("head_dim", [64, 80, 96, 112, 128, 256])
@pytest.mark.parametrize("block_size", [1, 8, 256])
def test_every_head_dim_and_block_size(head_dim, block_size):
    cache = make_cache(num_blocks=128, block_size=block_size, num_kv_heads=1, head_dim=head_dim,
                       layout="vllm")
    seq_ids = [make_seq(cache, n, seed=n)[0] for n in (5, 33)]
    q = torch.randn(2, 3, head_dim)
    torch.testing.assert_close(
        decode_attention(q, cache, seq_ids, scale=0.3),
        sdpa_on_gathered(q, cache, seq_ids, scale=0.3), atol=2e-5, rtol=1e-4,
    )


def test_reads_through_the_block_table_after_fork_and_copy_on_write():
    cache = make_cache(block_size=4)
    parent, _, _ = make_seq(cache, 6)
    child = cache.fork(parent)
    cache.append(child, *[t[:2] for t in cache.gather(parent)])
    q = torch.randn(2, 4, 64)
    torch.testing.assert_close(
        decode_attention(q, cache, [parent, child]), sdpa_on_gathered(q, cache, [parent, child])
    )


def test_one_token_attends_to_itself():
    cache = make_cache()
    seq_id, _, v = make_seq(cache, 1)
    out = decode_attention(torch.randn(1, 2, 64), cache, [seq_id])
    torch.testing.assert_close(out[0], v[0])


def test_bad_q():
    cache = make_cache(num_kv_heads=2)
    seq_id, _, _ = make_seq(cache, 3)
    with pytest.raises(ValueError, match=r"q.shape=\(2, 4, 64\): must be \[B=1"):
        decode_attention(torch.randn(2, 4, 64), cache, [seq_id])
    with pytest.raises(ValueError, match=r"q.shape=\(1, 4, 32\)"):
        decode_attention(torch.randn(1, 4, 32), cache, [seq_id])
    for num_qo_heads in (3, 0):
        with pytest.raises(ValueError, match=f"num_qo_heads={num_qo_heads}: must be a positive "
                                             "multiple of the cache's num_kv_heads=2"):
            decode_attention(torch.randn(1, num_qo_heads, 64), cache, [seq_id])
    with pytest.raises(ValueError, match="q: must be a floating-point torch.Tensor"):
        decode_attention(torch.ones(1, 4, 64, dtype=torch.int32), cache, [seq_id])
    with pytest.raises(ValueError, match="q.device=meta"):
        decode_attention(torch.randn(1, 4, 64, device="meta"), cache, [seq_id])
    with pytest.raises(ValueError, match="seq_id=5: not a live sequence"):
        decode_attention(torch.randn(1, 4, 64), cache, [5])


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), True, "0.3",
                                   torch.tensor(0.3), 1e39, -1e300, np.float64(1e300)])
def test_bad_scale(scale):
    cache = make_cache(num_kv_heads=2)
    seq_id, _, _ = make_seq(cache, 3)
    with pytest.raises(ValueError, match="must be a finite real number"):
        decode_attention(torch.randn(1, 4, 64), cache, [seq_id], scale=scale)


def test_no_seq_ids():
    with pytest.raises(ValueError, match=r"seq_ids=\[\]: must name at least one sequence"):
        decode_attention(torch.randn(0, 4, 64), make_cache(num_kv_heads=2), [])
