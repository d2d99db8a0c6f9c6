"""kernels/layer_ops.cu against the torch ops they replace (GPU), and where they are not used."""

import re

import pytest
import torch
import torch.nn.functional as F

from kvlab.cache import PagedKVCache
from kvlab.config import MODELS
from kvlab.kernels import layer_ops
from kvlab.model.rope import apply_rope, rope_cos_sin

DTYPES = [torch.float16, torch.bfloat16]
gpu = pytest.mark.gpu


def close(got, expected):
    """Equal to the dtype's precision: at most one rounding step apart, relative to the values'
    size (the kernels compute in fp32 where torch rounds between some ops)."""
    eps = torch.finfo(expected.dtype).eps
    scale = expected.float().abs().amax().clamp(min=1.0)
    err = (got.float() - expected.float()).abs().amax()
    assert err <= 4 * eps * scale, f"max error {err.item():.3g}, scale {scale.item():.3g}"


def tables(max_positions: int, head_dim: int, dtype):
    """cos, sin [max_positions, head_dim] with Llama 3's frequencies (rope scaling)."""
    m = MODELS["llama3-8b"]
    return rope_cos_sin(torch.arange(max_positions, device="cuda"), head_dim, m.rope_theta,
                        dtype, m.rope_scaling)


def rope_linear(rows: int, width: int, dtype, cache_dtype) -> torch.Tensor:
    """linear_rope_write of x [rows, 16] by a weight [width, 16], 4 Q heads, a cache of 2 KV
    heads of 64 (a width of 512 fits them)."""
    x = torch.zeros(rows, 16, dtype=dtype, device="cuda")
    norm = layer_ops.RmsNorm(torch.ones(16, dtype=dtype, device="cuda"), 1e-6)
    index = torch.zeros(rows, dtype=torch.int64, device="cuda")
    cache = PagedKVCache(2, 16, 2, 64, cache_dtype, "cuda")
    return layer_ops.linear_rope_write(x, norm, torch.zeros(width, 16, dtype=dtype, device="cuda"),
                                       None, 4, *tables(8, 64, dtype), index, cache, index)


def randn(*shape, dtype, seed=0):
    gen = torch.Generator("cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda").to(dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [8, 4096, 5120, 8192, 20000, 32768])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_rms_norm_and_residual_add(dtype, hidden, rows):
    x, delta = randn(rows, hidden, dtype=dtype), randn(rows, hidden, dtype=dtype, seed=1)
    weight = 1 + randn(hidden, dtype=dtype, seed=2) / 10
    normed, same = layer_ops.rms_norm(x, weight, 1e-5)
    assert same is x
    close(normed, weight * F.rms_norm(x.float(), (hidden,), eps=1e-5).to(dtype))
    normed, total = layer_ops.rms_norm(x, weight, 1e-5, residual=delta)
    assert torch.equal(total, x + delta)
    close(normed, weight * F.rms_norm(total.float(), (hidden,), eps=1e-5).to(dtype))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, head_dim", [(32, 128), (4, 64), (1, 256), (40, 128)])
def test_rope_of_a_strided_view(dtype, heads, head_dim):
    """A view into a fused QKV output (rows strided), at scattered positions."""
    cos, sin = tables(4096, head_dim, dtype)
    rows = 9
    qkv = randn(rows, heads * head_dim + 96, dtype=dtype)
    x = qkv[:, 32:32 + heads * head_dim].view(rows, heads, head_dim)
    positions = torch.tensor([0, 1, 7, 100, 511, 4095, 2, 3000, 64], device="cuda")
    got = layer_ops.rope(x, cos, sin, positions)
    assert got.is_contiguous() and got.shape == x.shape
    expected = apply_rope(x, cos[positions, None], sin[positions, None])
    close(got, expected)


@gpu
def test_rope_at_a_position_outside_its_table_gives_zeros():
    cos, sin = tables(16, 64, torch.float16)
    x = randn(2, 4, 64, dtype=torch.float16)
    got = layer_ops.rope(x, cos, sin, torch.tensor([3, 16], device="cuda"))
    assert torch.equal(got[1], torch.zeros_like(got[1])) and got[0].abs().sum() > 0


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_write_kv_equals_write_slots(dtype, layout, block_size):
    heads, head_dim, n = 4, 128, 11
    caches = [PagedKVCache(20, block_size, heads, head_dim, dtype, "cuda", layout)
              for _ in range(2)]
    kv = randn(n, 3 * heads * head_dim, dtype=dtype)  # rows strided, as from a fused GEMM
    k = kv[:, heads * head_dim:2 * heads * head_dim].view(n, heads, head_dim)
    v = kv[:, 2 * heads * head_dim:].view(n, heads, head_dim)
    slots = torch.randperm(20 * block_size, device="cuda")[:n]
    caches[0].write_slots(slots, k, v)
    layer_ops.write_kv(caches[1], slots, k, v)
    assert torch.equal(caches[1].k_cache, caches[0].k_cache)
    assert torch.equal(caches[1].v_cache, caches[0].v_cache)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("q_heads, kv_heads, head_dim, bias",
                         [(32, 8, 128, False), (28, 4, 128, True), (3, 1, 64, True),
                          (5, 1, 80, False)])
def test_linear_rope_write_equals_linear_then_rope_write(dtype, layout, rows, q_heads, kv_heads,
                                                         head_dim, bias):
    """Bit for bit the two kernels it fuses (the linear with the norm folded in, and
    rope_write), the QKV output never written: Q returned, K and V in the cache; with a bias
    (Qwen2's), a strided x, a slot outside the cache skipped and a position outside the tables
    giving zeros; heads of 80 and 64 too."""
    cos, sin = tables(512, head_dim, dtype)
    width = (q_heads + 2 * kv_heads) * head_dim
    x = randn(rows, 4096 + 64, dtype=dtype, seed=1)[:, 64:]
    norm = layer_ops.RmsNorm(1 + randn(4096, dtype=dtype, seed=4) / 4, 1e-6)
    w = randn(width, 4096, dtype=dtype, seed=2) / 64
    b = randn(width, dtype=dtype, seed=3) if bias else None
    positions = torch.tensor([37, 512][:rows], device="cuda")
    slots = torch.tensor([5, 10 * 16][:rows], device="cuda")  # 160: outside 10 blocks of 16
    caches = [PagedKVCache(10, 16, kv_heads, head_dim, dtype, "cuda", layout) for _ in range(2)]
    for cache in caches:  # not zeros: the zero K of position 512 must not be written
        cache.k_cache.copy_(randn(*cache.k_cache.shape, dtype=dtype, seed=5))
        cache.v_cache.copy_(randn(*cache.v_cache.shape, dtype=dtype, seed=6))
    expected_q = layer_ops.rope_write(layer_ops.linear(x, w, b, norm=norm), q_heads, cos, sin,
                                      positions, caches[0], slots)
    got_q = layer_ops.linear_rope_write(x, norm, w, b, q_heads, cos, sin, positions, caches[1],
                                        slots)
    assert got_q.is_contiguous() and torch.equal(got_q, expected_q)
    if rows == 2:
        assert torch.equal(got_q[1], torch.zeros_like(got_q[1]))
    assert torch.equal(caches[1].k_cache, caches[0].k_cache)
    assert torch.equal(caches[1].v_cache, caches[0].v_cache)


@gpu
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
def test_linear_rope_write_prefetching_writes_what_it_writes_without(layout):
    """Its cross-kernel prefetches (the next weight's bytes, the K/V blocks) are hints."""
    kv = paged_blocks(1, layout=layout)
    cos, sin = tables(512, 128, torch.float16)
    x = randn(1, 4096, dtype=torch.float16, seed=1)
    w = randn(6144, 4096, dtype=torch.float16, seed=2) / 64
    then = randn(4096, 4096, dtype=torch.float16, seed=3)
    position, slot = torch.tensor([100], device="cuda"), torch.tensor([17], device="cuda")
    caches = [PagedKVCache(4, 16, 8, 128, torch.float16, "cuda", layout) for _ in range(2)]
    norm = layer_ops.RmsNorm(torch.ones(4096, dtype=torch.float16, device="cuda"), 1e-5)
    without = layer_ops.linear_rope_write(x, norm, w, None, 32, cos, sin, position, caches[0],
                                          slot)
    got = layer_ops.linear_rope_write(x, norm, w, None, 32, cos, sin, position, caches[1], slot,
                                      ahead=then, ahead_bytes=1 << 20, kv_ahead=kv)
    assert torch.equal(got, without)
    assert torch.equal(caches[1].k_cache, caches[0].k_cache)
    assert torch.equal(caches[1].v_cache, caches[0].v_cache)


@gpu
def test_write_kv_skips_slots_outside_the_cache():
    cache = PagedKVCache(2, 16, 2, 64, torch.float16, "cuda")
    k = randn(2, 2, 64, dtype=torch.float16)
    layer_ops.write_kv(cache, torch.tensor([-1, 32], device="cuda"), k, k)
    assert cache.k_cache.abs().sum() == 0 and cache.v_cache.abs().sum() == 0


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(32, 8, 128), (28, 4, 128), (3, 1, 64)])
def test_rope_write_equals_rope_then_write_kv(dtype, layout, q_heads, kv_heads, head_dim):
    """Bit for bit, from a strided QKV output: Q rotated, K rotated into the cache, V written;
    a slot outside the cache skipped, a position outside the tables giving zeros."""
    cos, sin = tables(512, head_dim, dtype)
    n, width = 4, (q_heads + 2 * kv_heads) * head_dim
    qkv = randn(n, width + 64, dtype=dtype)[:, 32:32 + width]
    positions = torch.tensor([0, 511, 37, 512], device="cuda")
    slots = torch.tensor([5, 40, 10 * 16, 3], device="cuda")  # 160: outside 10 blocks of 16
    caches = [PagedKVCache(10, 16, kv_heads, head_dim, dtype, "cuda", layout) for _ in range(2)]
    for cache in caches:  # not zeros: the zero K of position 512 must be written
        cache.k_cache.copy_(randn(*cache.k_cache.shape, dtype=dtype, seed=5))
        cache.v_cache.copy_(randn(*cache.v_cache.shape, dtype=dtype, seed=6))
    q, k, v = (t.view(n, -1, head_dim) for t in
               qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1))
    expected_q = layer_ops.rope(q, cos, sin, positions)
    layer_ops.write_kv(caches[0], slots, layer_ops.rope(k, cos, sin, positions), v)
    got_q = layer_ops.rope_write(qkv, q_heads, cos, sin, positions, caches[1], slots)
    assert got_q.is_contiguous() and torch.equal(got_q, expected_q)
    assert torch.equal(got_q[3], torch.zeros_like(got_q[3]))
    assert torch.equal(caches[1].k_cache, caches[0].k_cache)
    assert torch.equal(caches[1].v_cache, caches[0].v_cache)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 14336), (64, 13824), (5, 8)])
def test_silu_mul(dtype, rows, n):
    gate_up = randn(rows, 2 * n, dtype=dtype) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    close(layer_ops.silu_mul(gate_up), F.silu(gate) * up)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols, width, start", [
    (1, 128256, 128256, 0), (64, 152064, 152064, 0), (3, 32000, 32000, 0),
    (256, 50272, 50272, 0),
    (5, 1001, 1008, 0),  # aligned rows with a tail past the last whole vector
    (4, 4101, 4104, 3),  # rows not 16-byte aligned: element by element
    (3, 1001, 1001, 0),  # a row stride that is no whole number of vectors
    (2, 7, 7, 0), (1, 1, 1, 0)])
def test_argmax_equals_torch(dtype, rows, cols, width, start):
    """Logits of real vocabularies (rounded to integers, so that many rows hold their maximum
    more than once), and the widths and offsets that read some or all of a row element by
    element."""
    x = (randn(rows, width, dtype=torch.float32, seed=cols) * 4).round().to(dtype)
    x = x[:, start:start + cols]
    assert torch.equal(layer_ops.argmax(x), x.argmax(dim=-1))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("start, cols", [(0, 9000), (0, 9005), (3, 9000)],
                         ids=["vectors", "a tail", "element by element"])
def test_argmax_takes_the_first_of_equal_values_and_nan_above_all(dtype, start, cols):
    x = torch.zeros(7, 9016, dtype=dtype, device="cuda")[:, start:start + cols]
    last = cols - 1                               # in the tail, where there is one
    x[1, [last, 4000, 17]] = 2.0                  # ties: the first
    x[2] = float("-inf")                          # all -inf: column 0
    x[3, [5000, 5001, last]] = float("nan")       # the first NaN, two of them in one vector
    x[3, 7] = float("inf")
    x[4, last] = float("inf")
    x[5] = -3.0
    x[5, 1234] = -1.0                             # all negative
    x[6] = -1.0
    x[6, 11], x[6, 12], x[6, 30] = -0.0, 0.0, 0.0  # -0 and +0 are equal: the first
    got = layer_ops.argmax(x).tolist()
    assert got == [0, 17, 0, 5000, last, 1234, 11] == x.argmax(dim=-1).tolist()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("n, k, bias", [(4096, 4096, False), (13, 4104, True), (1, 8, True),
                                        (152064, 3584, False), (3, 18944, True)])
def test_linear_equals_an_fp32_matmul_rounded_once(dtype, rows, n, k, bias):
    """Every column (n not a multiple of a CTA's LINEAR_COLS rows, k not of the 2,048 elements
    a CTA's loads reach at once), with and without a bias, x a view with a longer row stride."""
    x = randn(rows, k + 16, dtype=dtype, seed=1)[:, 8:k + 8]
    w = randn(n, k, dtype=dtype, seed=2) / k ** 0.5
    b = randn(n, dtype=dtype, seed=3) if bias else None
    expected = x.float() @ w.float().T + (0 if b is None else b.float())
    close(layer_ops.linear(x, w, b), expected.to(dtype))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("n, k, bias", [(2 * 14336, 4096, False), (2 * 13, 4104, True),
                                        (2, 8, True), (2 * 76, 5120, False)])
def test_linear_with_a_norm_equals_rms_norm_before_it(dtype, rows, swiglu, n, k, bias):
    """To the dtype's precision (the normed x is not rounded), against an fp32 reference and
    against rms_norm then the linear: every row's squares summed over the whole k (k not a
    multiple of what a CTA's loads reach at once, or below one warp's), with a bias and
    with SwiGLU's product."""
    h = randn(rows, k, dtype=dtype, seed=1) * 3
    gamma = 1 + randn(k, dtype=dtype, seed=4) / 4
    w = randn(n, k, dtype=dtype, seed=2) * 3 / k ** 0.5
    b = randn(n, dtype=dtype, seed=3) if bias else None
    norm = layer_ops.RmsNorm(gamma, 1e-5)
    got = layer_ops.linear(h, w, b, swiglu=swiglu, norm=norm)
    normed = gamma.float() * h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True)
                                                     + 1e-5)
    y = normed @ w.float().T + (0 if b is None else b.float())
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    close(got, y.to(dtype))
    apart = layer_ops.linear(layer_ops.rms_norm(h, gamma, 1e-5)[0], w, b, swiglu=swiglu)
    close(got, apart)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("n, k, bias", [(4096, 14336, False), (13, 4104, True)])
def test_linear_with_a_residual_equals_the_add_after_it(dtype, rows, n, k, bias):
    """Bit for bit: the epilogue rounds as `residual + linear(...)` does."""
    x, w = randn(rows, k, dtype=dtype, seed=1), randn(n, k, dtype=dtype, seed=2) / k ** 0.5
    b = randn(n, dtype=dtype, seed=3) if bias else None
    residual = randn(rows, n, dtype=dtype, seed=4) * 4
    got = layer_ops.linear(x, w, b, residual=residual)
    assert torch.equal(got, residual + layer_ops.linear(x, w, b))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("n, k, bias", [(2 * 14336, 4096, False), (2 * 24, 4104, True),
                                        (2 * 13, 4104, True), (2, 8, False)])
def test_linear_with_swiglu_equals_silu_mul_after_it(dtype, rows, n, k, bias):
    """Bit for bit where silu_mul takes y (8 | n / 2); to the dtype's precision against torch
    everywhere, n / 2 odd too (a CTA's gate and up rows clipped at the end)."""
    x, w = randn(rows, k, dtype=dtype, seed=1), randn(n, k, dtype=dtype, seed=2) * 3 / k ** 0.5
    b = randn(n, dtype=dtype, seed=3) if bias else None
    got = layer_ops.linear(x, w, b, swiglu=True)
    assert got.shape == (rows, n // 2)
    y = layer_ops.linear(x, w, b)
    if n // 2 % layer_ops.VEC == 0:
        assert torch.equal(got, layer_ops.silu_mul(y))
    gate, up = y.chunk(2, dim=-1)
    close(got, F.silu(gate) * up)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("epilogue", ["plain", "residual", "swiglu"])
@pytest.mark.parametrize("ahead_bytes", [16, 4096 + 16, 3 << 20, 1 << 40])
def test_linear_prefetching_ahead_writes_what_it_writes_without(dtype, rows, epilogue,
                                                                 ahead_bytes):
    """The cross-kernel prefetch is a hint: bit for bit the same output, whether the share of
    each last-wave CTA is a granule, a chunk and a bit, or the whole next weight (clipped to
    it); a grid smaller than a wave (n = 24) prefetches from every CTA."""
    for n in (2 * 14336, 24):
        x = randn(rows, 4096, dtype=dtype, seed=1)
        w = randn(n, 4096, dtype=dtype, seed=2) / 64
        residual = randn(rows, n, dtype=dtype, seed=3) if epilogue == "residual" else None
        then = randn(4096, 14336, dtype=dtype, seed=4)
        kwargs = {"residual": residual, "swiglu": epilogue == "swiglu"}
        without = layer_ops.linear(x, w, **kwargs)
        got = layer_ops.linear(x, w, **kwargs, ahead=then, ahead_bytes=ahead_bytes)
        assert torch.equal(got, without)


def paged_blocks(rows: int, device: str = "cuda", layout: str = "hnd",
                 dtype=torch.float16) -> layer_ops.PagedAhead:
    """A layer's paged cache of 64 blocks of 16 tokens (8 KV heads of 128), rows of 40, 200 and
    1 tokens in turn on shuffled blocks, with room for up to 1 MiB of K and V together."""
    cache = PagedKVCache(64, 16, 8, 128, dtype, device, layout)
    lens = torch.tensor([(40, 200, 1)[r % 3] for r in range(rows)], dtype=torch.int32)
    tables = torch.randperm(64, generator=torch.Generator().manual_seed(rows))[:rows * 13]
    tables = tables.view(rows, 13).to(torch.int32)
    return layer_ops.PagedAhead(cache.k_cache, cache.v_cache, tables.to(device), lens.to(device),
                                16, 1 << 20)


@gpu
@pytest.mark.parametrize("rows", range(1, layer_ops.LINEAR_ROWS + 1))
@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("nbytes", [0, 64 << 10, 1 << 20, 1 << 30])
def test_linear_prefetching_kv_blocks_writes_what_it_writes_without(rows, layout, nbytes):
    """The K/V blocks' prefetch is a hint: bit for bit the same output, for a budget of none,
    of one block pair, of some and of more than the tables hold, on both cache layouts; table
    entries past a row's length, and ids outside the cache there, are never prefetched."""
    kv = paged_blocks(rows, layout=layout)
    kv.block_tables[:, 12] = 1 << 20  # past every row's blocks: never read
    kv = layer_ops.PagedAhead(kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 16, nbytes)
    x = randn(rows, 4096, dtype=torch.float16, seed=1)
    w = randn(6144, 4096, dtype=torch.float16, seed=2) / 64
    then = randn(4096, 4096, dtype=torch.float16, seed=3)
    without = layer_ops.linear(x, w)
    assert torch.equal(layer_ops.linear(x, w, kv_ahead=kv), without)
    assert torch.equal(layer_ops.linear(x, w, ahead=then, ahead_bytes=1 << 20, kv_ahead=kv),
                       without)
    torch.cuda.synchronize()


def test_the_kv_prefetch_counts_whole_block_pairs_within_its_budget_and_the_tables():
    kv = paged_blocks(2, device="cpu")  # a block: 16 x 8 x 128 fp16 = 32 KiB
    assert kv.block_bytes == 32 << 10
    assert kv.pairs == (1 << 20) // (64 << 10) == 16
    small = layer_ops.PagedAhead(kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 16,
                                 (64 << 10) - 16)
    assert small.pairs == 0  # not even one pair
    huge = layer_ops.PagedAhead(kv.k_cache, kv.v_cache, kv.block_tables, kv.seq_lens, 16, 1 << 30)
    assert huge.pairs == kv.block_tables.numel() == 26


def test_linear_says_which_kv_prefetch_it_cannot_take():
    """On the CPU too: the K/V prefetch's checks come before any launch (the device is x's)."""
    cpu = torch.device("cpu")
    kv = paged_blocks(2, device="cpu")

    def problem(**change):
        fields = {name: getattr(kv, name) for name in (
            "k_cache", "v_cache", "block_tables", "seq_lens", "block_size", "nbytes")}
        return layer_ops.paged_ahead_problem(layer_ops.PagedAhead(**{**fields, **change}), cpu)

    assert layer_ops.paged_ahead_problem(None, cpu) is None
    assert problem() is None
    assert layer_ops.paged_ahead_problem(kv, torch.device("cuda")).startswith(
        "kv_ahead: k_cache, v_cache, block_tables and seq_lens must be contiguous tensors on cuda")
    assert layer_ops.paged_ahead_problem((kv.k_cache, kv.v_cache), cpu) == (
        "kv_ahead: a tuple, must be a layer_ops.PagedAhead or None")
    for change, message in (
            ({"nbytes": -1}, r"kv_ahead.nbytes=-1: must be an integer >= 0"),
            ({"nbytes": 2.0}, r"kv_ahead.nbytes=2.0: must be an integer >= 0"),
            ({"block_size": 0}, r"kv_ahead.block_size=0: must be an integer in \[1, 2\*\*31\)"),
            ({"block_size": 1 << 31}, r"kv_ahead.block_size=2147483648: must be an integer in"),
            ({"k_cache": kv.k_cache[:0], "v_cache": kv.v_cache[:0]}, r"\[num_blocks >= 1, "),
            ({"k_cache": kv.k_cache[:, :0], "v_cache": kv.v_cache[:, :0]}, r"\(> 0\)"),
            ({"v_cache": kv.v_cache[:32]}, r"k_cache \(64, 8, 16, 128\) and v_cache "
             r"\(32, 8, 16, 128\) must be \[num_blocks >= 1, ...\] of one dtype"),
            ({"v_cache": kv.v_cache.float()}, "of one dtype"),
            ({"k_cache": kv.k_cache[:, :, :, :3].contiguous()}, "a block the same multiple"),
            ({"block_tables": kv.block_tables.long()}, r"block_tables \(2, 13\) torch.int64 "
             r"and seq_lens \(2,\) torch.int32 must be int32 \[rows, cols\] and \[rows\]"),
            ({"seq_lens": kv.seq_lens[:1]}, r"seq_lens \(1,\) torch.int32 must be"),
            ({"block_tables": kv.block_tables.T}, "must be contiguous tensors on cpu")):
        assert re.search(message, problem(**change)), change


@gpu
@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("ahead_bytes", [16, 1 << 20, 1 << 40])
def test_norm_and_swiglu_prefetching_ahead_write_what_they_write_without(rows, ahead_bytes):
    """The RMSNorm (with and without its residual) and SwiGLU's product kernels, every CTA
    prefetching a share of the next GEMM's weight: bit for bit their output without."""
    x, residual = (randn(rows, 4096, dtype=torch.float16, seed=s) for s in (1, 2))
    weight = randn(4096, dtype=torch.float16, seed=3)
    then = randn(14336, 4096, dtype=torch.float16, seed=4)
    for extra in (None, residual):
        plain = layer_ops.rms_norm(x, weight, 1e-5, extra)
        ahead = layer_ops.rms_norm(x, weight, 1e-5, extra, ahead=then, ahead_bytes=ahead_bytes)
        assert all(torch.equal(a, b) for a, b in zip(ahead, plain, strict=True))
    gate_up = randn(rows, 2 * 14336, dtype=torch.float16, seed=5)
    assert torch.equal(layer_ops.silu_mul(gate_up, ahead=then, ahead_bytes=ahead_bytes),
                       layer_ops.silu_mul(gate_up))


@gpu
def test_the_layers_take_linear_for_a_few_rows_only(monkeypatch):
    """kvlab.model.layer.linear runs layer_ops.linear where it takes the tensors (and gets its
    answer), F.linear elsewhere: more rows, or a weight it cannot stream."""
    from kvlab.model import layer

    calls, kernel = [], layer_ops.linear

    def counted(*args, **kwargs):
        calls.append(args[0].shape[0])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(layer.layer_ops, "linear", counted)
    w = randn(64, 128, dtype=torch.float16)
    for rows in (1, layer_ops.LINEAR_ROWS, layer_ops.LINEAR_ROWS + 1, 300):
        x = randn(rows, 128, dtype=torch.float16, seed=rows)
        close(layer.linear(x, w), (x.float() @ w.float().T).half())
    assert calls == sorted({1, layer_ops.LINEAR_ROWS})
    layer.linear(randn(1, 128, dtype=torch.float16), randn(128, 64, dtype=torch.float16).T)
    assert len(calls) == len({1, layer_ops.LINEAR_ROWS})  # a transposed weight: F.linear


@gpu
@pytest.mark.parametrize("call, message", [
    (lambda: layer_ops.rms_norm(torch.zeros(2, 12, dtype=torch.float16, device="cuda"),
                                torch.ones(12, dtype=torch.float16, device="cuda"), 1e-5),
     r"x: .*\[rows, 12\] with contiguous, 16-byte aligned rows \(8 \| 12\)"),
    (lambda: layer_ops.rms_norm(torch.zeros(2, 16, device="cuda"),
                                torch.ones(16, device="cuda"), 1e-5),
     "one dtype .fp16 or bf16. on one CUDA device"),
    (lambda: layer_ops.rope(torch.zeros(2, 4, 8, dtype=torch.float16, device="cuda"),
                            torch.zeros(10, 8, dtype=torch.float16, device="cuda"),
                            torch.zeros(10, 8, dtype=torch.float16, device="cuda"),
                            torch.zeros(2, dtype=torch.int32, device="cuda")),
     r"positions: must be int64 \[2\]"),
    (lambda: layer_ops.silu_mul(torch.zeros(2, 24, dtype=torch.float16, device="cuda")),
     r"gate_up: shape \(2, 24\): must be contiguous \[rows, 2 n\], 8 \| n"),
    (lambda: layer_ops.write_kv(PagedKVCache(2, 16, 2, 64, torch.float16, "cuda"),
                                torch.tensor([0], device="cuda"),
                                torch.zeros(1, 2, 64, dtype=torch.bfloat16, device="cuda"),
                                torch.zeros(1, 2, 64, dtype=torch.bfloat16, device="cuda")),
     r"must be the cache's dtype \(torch.float16\)"),
    (lambda: layer_ops.linear(torch.zeros(9, 16, dtype=torch.float16, device="cuda"),
                              torch.zeros(4, 16, dtype=torch.float16, device="cuda")),
     rf"x: shape \(9, 16\), must be \[rows, k\] with 1 <= rows <= {layer_ops.LINEAR_ROWS}"),
    (lambda: layer_ops.linear(torch.zeros(1, 12, dtype=torch.float16, device="cuda"),
                              torch.zeros(4, 12, dtype=torch.float16, device="cuda")),
     r"x: .* 16-byte aligned rows \(8 \| 12\)"),
    (lambda: layer_ops.linear(torch.zeros(1, 16, dtype=torch.float16, device="cuda"),
                              torch.zeros(16, 4, dtype=torch.float16, device="cuda").T),
     r"weight: shape \(4, 16\), must be contiguous \[n, 16\]"),
    (lambda: layer_ops.linear(torch.zeros(1, 16, dtype=torch.float16, device="cuda"),
                              torch.zeros(4, 16, dtype=torch.float16, device="cuda"),
                              torch.zeros(5, dtype=torch.float16, device="cuda")),
     r"bias: shape \(5,\), must be \(4,\)"),
    (lambda: layer_ops.linear(torch.zeros(1, 16, dtype=torch.float16, device="cuda"),
                              torch.zeros(4, 16, dtype=torch.bfloat16, device="cuda")),
     "one dtype .fp16 or bf16. on one CUDA device"),
    (lambda: layer_ops.rope_write(torch.zeros(1, 5 * 64, dtype=torch.float16, device="cuda"), 4,
                                  *tables(8, 64, torch.float16),
                                  torch.zeros(1, dtype=torch.int64, device="cuda"),
                                  PagedKVCache(2, 16, 2, 64, torch.float16, "cuda"),
                                  torch.zeros(1, dtype=torch.int64, device="cuda")),
     r"qkv: shape \(1, 320\) .* must be \[n, 512\] \(\(num_qo_heads=4 \+ 2 x 2\) x 64\)"),
    (lambda: layer_ops.rope_write(torch.zeros(1, 8 * 64, dtype=torch.bfloat16, device="cuda"), 4,
                                  *tables(8, 64, torch.bfloat16),
                                  torch.zeros(1, dtype=torch.int64, device="cuda"),
                                  PagedKVCache(2, 16, 2, 64, torch.float16, "cuda"),
                                  torch.zeros(1, dtype=torch.int64, device="cuda")),
     r"must be the cache's dtype \(torch.float16\)"),
    (lambda: rope_linear(1, 5 * 64, torch.float16, torch.float16),
     r"weight: shape \(320, 16\), must have 512 rows \(\(num_qo_heads=4 \+ 2 x 2\) x 64\)"),
    (lambda: rope_linear(3, 8 * 64, torch.float16, torch.float16),
     r"x: shape \(3, 16\), must be \[rows, k\] with 1 <= rows <= 2"),
    (lambda: rope_linear(1, 8 * 64, torch.bfloat16, torch.float16),
     r"x, cos, sin: .* must be the cache's dtype \(torch.float16\)"),
    (lambda: layer_ops.argmax(torch.zeros(4, 8, device="cuda")), r"x: fp16 or bf16"),
    (lambda: layer_ops.argmax(torch.zeros(4, 0, dtype=torch.float16, device="cuda")),
     r"x: shape \(4, 0\) .* cols >= 1"),
    (lambda: layer_ops.argmax(torch.zeros(8, 4, dtype=torch.float16, device="cuda").T),
     r"x: shape \(4, 8\) strides \(1, 4\), .* contiguous along a row"),
    (lambda: layer_ops.argmax(torch.zeros(8, dtype=torch.float16, device="cuda")),
     r"x: shape \(8,\) .* must be \[rows, cols\]"),
])
def test_bad_tensors_are_refused_before_a_launch(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def half(*shape):
    return torch.zeros(*shape, dtype=torch.float16)


@pytest.mark.parametrize("x, weight, bias, message", [
    (half(3, 16), half(4, 16), None, r"x: shape \(3, 16\), must be \[rows, k\] with 1 <= rows"),
    (half(1, 12), half(4, 12), None, r"x: .* 16-byte aligned rows \(8 \| 12\)"),
    (half(1, 24)[:, 4:20], half(4, 16), None, r"x: .* strides \(24, 1\): .*16-byte aligned"),
    (half(2, 20)[:, :16], half(4, 16), None, r"x: .* strides \(20, 1\)"),
    (half(1, 16), half(16, 4).T, None, r"weight: shape \(4, 16\), must be contiguous"),
    (half(1, 16), half(4, 16), half(5), r"bias: shape \(5,\), must be \(4,\)"),
    (half(1, 16), half(4, 16), torch.zeros(4), "one dtype .fp16 or bf16. on one CUDA device"),
    (half(1, 16), half(4, 16), None, "one dtype .fp16 or bf16. on one CUDA device"),  # the CPU
])
def test_linear_says_what_it_cannot_take(x, weight, bias, message):
    """On the CPU too: every refusal but the last (the device) comes from shapes, strides and
    alignment, so it is checked here without a GPU."""
    assert re.search(message, layer_ops.linear_problem(x, weight, bias))


@pytest.mark.parametrize("ahead, ahead_bytes, message", [
    (half(4, 16), -1, r"ahead_bytes=-1: must be an integer >= 0"),
    (half(4, 16), 2.0, r"ahead_bytes=2.0: must be an integer >= 0"),
    (half(4, 16), True, r"ahead_bytes=True: must be an integer >= 0"),
    (half(4, 16), 64, r"ahead: must be a contiguous, 16-byte aligned tensor on cuda"),
    ("w_o", 64, r"ahead: must be a contiguous, 16-byte aligned tensor"),
])
def test_linear_says_which_prefetch_ahead_it_cannot_take(ahead, ahead_bytes, message):
    """The prefetch's checks come before any launch, on the CPU too (the device is x's)."""
    assert re.search(message, layer_ops.ahead_problem(ahead, ahead_bytes, torch.device("cuda")))
    assert layer_ops.ahead_problem(None, 64, torch.device("cuda")) is None  # nothing to prefetch
    assert layer_ops.ahead_problem(half(4, 16)[:, ::2], 0, torch.device("cuda")) is None  # off


def test_linear_prefetches_the_first_bytes_asked_at_most_all_in_granules():
    weight = half(4, 16)  # 128 bytes
    assert [layer_ops.ahead_span(weight, b) for b in (0, 15, 16, 100, 128, 1 << 40)] == [
        0, 0, 16, 96, 128, 128]
    assert layer_ops.ahead_span(None, 1 << 20) == 0


@pytest.mark.parametrize("residual, swiglu, message", [
    (half(2, 4), False, r"residual: shape \(2, 4\), must be \(1, 4\)"),
    (half(1, 8)[:, ::2], False, r"residual: .* contiguous"),
    (half(1, 4), True, r"swiglu: .* and no residual"),
    (None, True, r"swiglu: weight shape \(5, 16\)"),
])
def test_linear_says_which_epilogue_it_cannot_take(residual, swiglu, message):
    weight = half(5, 16) if swiglu and residual is None else half(4, 16)
    assert re.search(message, layer_ops.linear_problem(half(1, 16), weight, None, residual,
                                                       swiglu))


@pytest.mark.parametrize("norm, residual, message", [
    (layer_ops.RmsNorm(half(8), 1e-6), None, r"norm.weight: shape \(8,\), must be \(16,\)"),
    (layer_ops.RmsNorm(half(32)[::2], 1e-6), None, r"norm.weight: .* contiguous"),
    (layer_ops.RmsNorm(half(16), 0.0), None, r"norm.eps=0.0: must be a finite number > 0"),
    (layer_ops.RmsNorm(half(16), float("nan")), None, r"norm.eps=nan"),
    (layer_ops.RmsNorm(half(16), 1e-6), half(1, 4), "norm and residual: a linear takes one"),
    ((half(16), 1e-6), None, r"norm: a tuple, must be a layer_ops.RmsNorm or None"),
])
def test_linear_says_which_norm_it_cannot_take(norm, residual, message):
    """On the CPU: the folded norm's checks come before the device's."""
    assert re.search(message, layer_ops.linear_problem(half(1, 16), half(4, 16), None, residual,
                                                       norm=norm))


def test_linear_rope_write_needs_its_norm():
    cache = PagedKVCache(2, 16, 2, 64, torch.float16, "cpu")
    index = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"norm: must be a layer_ops.RmsNorm"):
        layer_ops.linear_rope_write(half(1, 16), None, half(512, 16), None, 4, half(8, 64),
                                    half(8, 64), index, cache, index)


@pytest.mark.parametrize("num_qo_heads, qkv_width, cos, message", [
    (0, 4 * 64, half(8, 64), r"num_qo_heads=0: must be a positive integer"),
    (2.0, 6 * 64, half(8, 64), r"num_qo_heads=2.0: must be a positive integer"),
    (4, 5 * 64, half(8, 64), r"qkv: shape \(1, 320\) .* must be \[n, 512\]"),
    (4, 8 * 64, half(()), r"cos, sin: \(\), \(\): must be contiguous \[max_positions, 64\]"),
])
def test_rope_write_refuses_before_a_launch(num_qo_heads, qkv_width, cos, message):
    """On the CPU: the shape checks come before the device's."""
    cache = PagedKVCache(2, 16, 2, 64, torch.float16, "cpu")
    index = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        layer_ops.rope_write(half(1, qkv_width), num_qo_heads, cos, cos, index, cache, index)


def test_the_layers_linear_falls_back_to_torch_with_its_epilogue():
    """On the CPU, kvlab.model.layer.linear's residual and SwiGLU equal the torch ops."""
    from kvlab.model import layer

    x, w = torch.randn(3, 16), torch.randn(10, 16)
    residual = torch.randn(3, 10)
    assert torch.equal(layer.linear(x, w, residual=residual), residual + F.linear(x, w))
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    assert torch.equal(layer.linear(x, w, swiglu=True), F.silu(gate) * up)


def test_the_torch_ops_run_where_the_kernels_cannot():
    assert not layer_ops.usable(torch.zeros(8, dtype=torch.float16))  # on the CPU
    if torch.cuda.is_available():
        assert not layer_ops.usable(torch.zeros(8, device="cuda"))  # fp32


def test_every_instantiation_is_named_once():
    names = layer_ops.default_instances()
    # per dtype: the norms; rope and silu_mul; write_kv and rope_write in two layouts; linear,
    # and with a norm folded in (not with the residual); linear_rope_write in two layouts; argmax
    assert len(names) == len(set(names)) == 2 * (
        len(layer_ops.NORM_VECS) + 2 + 4
        + layer_ops.LINEAR_ROWS * (2 * len(layer_ops.LINEAR_EPILOGUES) - 1)
        + layer_ops.LINEAR_ROWS * 2 + 1)
    assert 1 <= layer_ops.LINEAR_WARPS <= 8  # the kernel's LINEAR_MAX_WARPS
