"""gqa on an fp8 (e4m3) cache, with fp16 or bf16 q: against kvlab.reference.decode_attention on
the same cache, which dequantises (GPU), and what the plan refuses before any launch."""

import math

import pytest
import torch
from factories import force_gqa_warps

import kvlab
from kvlab.cache import PagedKVCache
from kvlab.cache.fp8 import FP8_DTYPE
from kvlab.checks import HEAD_DIMS
from kvlab.kernels import gqa
from kvlab.kernels.decode import _check_q_dtype, check_kernel
from kvlab.kernels.loader import load
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.reference import decode_attention as reference

NUM_KV_HEADS = 2
# the kernel widens e4m3 to fp16 exactly, folds the K scale into the softmax scale and applies
# the V scale once: what is left is the fp16 mma and P rounded to fp16, as on an fp16 cache, and
# for a bf16 q (converted to fp16 exactly) the output rounded to bf16 (2^-9 relative)
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 4e-3}
MIXED = [1, 17, 97, 3000, 3, 600]  # long ones: split-KV and the merge
MANY = [1 + (37 * i) % 256 for i in range(160)]  # one partition per CTA
BULK = PrefetchConfig("bulk")
CASES = list(dict.fromkeys(
    [(d, 4, 16, PrefetchConfig()) for d in HEAD_DIMS]
    + [(d, 1, 16, BULK) for d in HEAD_DIMS]
    + [(128, g, 16, BULK) for g in range(1, 9)]
    + [(80, 3, b, PrefetchConfig("line")) for b in gqa.FAMILY.block_sizes]
    + [(128, 4, 16, p) for p in (PrefetchConfig("bulk", distance=4),
                                 PrefetchConfig("line", distance=2))]))
# a bf16 q: every head dim, every group at head_dim 128, and the smallest and largest blocks
BF16_CASES = list(dict.fromkeys(
    [(d, 4, 16, PrefetchConfig()) for d in HEAD_DIMS]
    + [(128, g, 16, PrefetchConfig()) for g in range(1, 9)]
    + [(96, 2, b, BULK) for b in (8, 256)]))


def case_id(case):
    head_dim, group, block_size, prefetch = case
    return f"d{head_dim}-g{group}-b{block_size}-{prefetch.label()}"


@pytest.fixture(scope="module")
def compiled():
    names = [n for dtype, cases in ((torch.float16, CASES), (torch.bfloat16, BF16_CASES))
             for d, g, b, p in cases
             for n in gqa.name_expressions(dtype, d, b, g, p, FP8_DTYPE)]
    load(gqa.SOURCE, list(dict.fromkeys(names)))


def make_batch(head_dim, block_size, lens, seed, scale=1.0, k_scale=None):
    """An fp8 cache whose unwritten slots hold e4m3 NaN, then sequences of random K/V (times
    `scale`, K times `k_scale` if given: the per-head scales follow; written from fp32) scattered
    over it."""
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    cache = PagedKVCache(num_blocks, block_size, NUM_KV_HEADS, head_dim, dtype=FP8_DTYPE,
                         device="cuda", layout="hnd", seed=seed)
    cache.k_cache.view(torch.uint8).fill_(0x7F)  # NaN: slots no sequence wrote must not leak
    cache.v_cache.view(torch.uint8).fill_(0x7F)
    seq_ids = []
    for n in lens:
        k, v = (scale * torch.randn(n, NUM_KV_HEADS, head_dim, device="cuda") for _ in "kv")
        seq_ids.append(cache.add_sequence(k if k_scale is None else k * k_scale, v))
    return cache, seq_ids


def rel_l2(out, ref):
    """The worst relative L2 error of any one sequence."""
    diff = (out.float() - ref).flatten(1).norm(dim=1)
    return (diff / ref.flatten(1).norm(dim=1)).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, case", [(torch.float16, c) for c in CASES]
                         + [(torch.bfloat16, c) for c in BF16_CASES],
                         ids=lambda x: case_id(x) if isinstance(x, tuple) else str(x)[6:])
def test_matches_the_reference_on_the_same_fp8_cache(dtype, case, compiled):
    head_dim, group, block_size, prefetch = case
    for lens, seed in ((MIXED, 0), (MANY, 1)):
        cache, seq_ids = make_batch(head_dim, block_size, lens, seed)
        q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, device="cuda", dtype=dtype)
        plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel="gqa", prefetch=prefetch,
                                q_dtype=dtype)
        assert (plan.launcher.num_partitions > 1) == (lens is MIXED)
        out = plan.run(q, out=torch.full_like(q, math.nan))
        assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs"
        assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[dtype], (lens[:6], case)


# CTAs of 8 warps (split_plan's choice for fp8 where lone CTAs of 4 cannot keep HBM busy),
# forced at every length: each head_dim they run (not 256), MHA, the smallest and largest block
EIGHT_WARP_CASES = list(dict.fromkeys(
    [(d, 4, 16, PrefetchConfig()) for d in HEAD_DIMS if d != 256]
    + [(128, 1, b, BULK) for b in (8, 256)]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, case", [(torch.float16, c) for c in EIGHT_WARP_CASES]
                         + [(torch.bfloat16, EIGHT_WARP_CASES[0])],
                         ids=lambda x: case_id(x) if isinstance(x, tuple) else str(x)[6:])
def test_8_warps_match_the_reference_on_the_same_fp8_cache(dtype, case, monkeypatch):
    head_dim, group, block_size, prefetch = case
    force_gqa_warps(monkeypatch, 8)
    for seed, lens in enumerate(([700] * 3, [300] * 5, MIXED)):
        cache, seq_ids = make_batch(head_dim, block_size, lens, seed)
        q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, device="cuda", dtype=dtype)
        plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel="gqa", prefetch=prefetch,
                                q_dtype=dtype)
        assert plan.launcher.warps == 8
        out = plan.run(q, out=torch.full_like(q, math.nan))
        assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs"
        assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[dtype], (lens[:6], case)


@pytest.mark.gpu
@pytest.mark.parametrize("q_size, k_size", [(1e5, 1e-4), (1e-6, 1e6)], ids=["large", "small"])
def test_a_bf16_q_outside_fp16s_range_keeps_its_logits(q_size, k_size, compiled):
    """A bf16 q of 1e5 overflows fp16 (and 1e-6 is an fp16 subnormal of 1-2 significant bits):
    converted without its power-of-two rescale, the first would give inf logits and the second
    logits off by percents. K is scaled the other way, so the logits stay of order one. The
    group's heads differ by up to 4^7 in size."""
    cache, seq_ids = make_batch(128, 16, MIXED, seed=5, k_scale=k_size)
    group = 8
    sizes = q_size * 0.25 ** torch.arange(group, device="cuda").repeat(NUM_KV_HEADS)
    q = (torch.randn(len(MIXED), NUM_KV_HEADS * group, 128, device="cuda")
         * sizes[None, :, None]).bfloat16()
    out = kvlab.decode_attention(q, cache, seq_ids, kernel="gqa", prefetch=PrefetchConfig())
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
def test_the_scales_reach_the_output(compiled):
    """Values 50x larger: scales of ~50/448 per head; without them the output would be off by
    that factor (V) and the softmax flattened (K)."""
    cache, seq_ids = make_batch(128, 16, MIXED, seed=3, scale=50.0)
    assert (cache.k_scale > 0.1).all() and (cache.v_scale > 0.1).all()
    q = torch.randn(len(MIXED), NUM_KV_HEADS * 4, 128, device="cuda").half() / 10
    out = kvlab.decode_attention(q, cache, seq_ids, kernel="gqa", prefetch=BULK)
    assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[torch.float16]


@pytest.mark.gpu
def test_auto_runs_gqa_on_an_fp8_cache_and_q_has_the_plans_dtype(compiled):
    cache, seq_ids = make_batch(128, 16, [300, 5], seed=4)
    q = torch.randn(2, NUM_KV_HEADS * 4, 128, device="cuda").half()
    plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], prefetch=PrefetchConfig())
    assert plan.kernel == "gqa" and plan.q_dtype == torch.float16
    assert rel_l2(plan.run(q), reference(q, cache, seq_ids)) < TOLERANCE[torch.float16]
    with pytest.raises(ValueError, match=r"q.dtype=torch.bfloat16: must be torch.float16"):
        plan.run(q.bfloat16())
    plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], prefetch=PrefetchConfig(),
                            q_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"q.dtype=torch.float16: must be torch.bfloat16"):
        plan.run(q)


def test_q_dtype_over_each_cache_dtype():
    fp8 = PagedKVCache(4, 16, 2, 128, dtype=FP8_DTYPE, device="cpu", layout="hnd")
    fp16 = PagedKVCache(4, 16, 2, 128, dtype=torch.float16, device="cpu", layout="hnd")
    assert _check_q_dtype(fp8, None) == torch.float16
    assert _check_q_dtype(fp8, torch.bfloat16) == torch.bfloat16
    assert _check_q_dtype(fp16, None) == torch.float16
    with pytest.raises(ValueError, match=r"q_dtype=torch.float32: over a cache of "
                                         r"torch.float8_e4m3fn q and out must be one of "
                                         r"\(torch.float16, torch.bfloat16\)"):
        _check_q_dtype(fp8, torch.float32)
    with pytest.raises(ValueError, match=r"q_dtype=torch.bfloat16: over a cache of "
                                         r"torch.float16 q and out must be one of "
                                         r"\(torch.float16,\)"):
        _check_q_dtype(fp16, torch.bfloat16)


def test_vllm_v1_refuses_an_fp8_cache():
    cache = PagedKVCache(4, 16, 2, 128, dtype=FP8_DTYPE, device="cpu", layout="vllm")
    with pytest.raises(ValueError, match=r"kernel='vllm_v1' reads fp16 and bf16 caches; an fp8 "
                                         r"cache is read by kernel='gqa' \(layout 'hnd'\)"):
        check_kernel("vllm_v1", cache, 8)


def test_fp8_instantiations_name_the_fp8_cache_type():
    decode, merge = gqa.name_expressions(torch.float16, 128, 16, 4, BULK, FP8_DTYPE)
    assert decode.startswith("kvlab::gqa_decode<__half, kvlab::fp8_e4m3, 128, 16, 4, ")
    assert merge == "kvlab::gqa_merge<__half, 128>"
    decode, merge = gqa.name_expressions(torch.bfloat16, 64, 16, 1, BULK, FP8_DTYPE)
    assert decode.startswith("kvlab::gqa_decode<__nv_bfloat16, kvlab::fp8_e4m3, 64, 16, 1, ")
    assert merge == "kvlab::gqa_merge<__nv_bfloat16, 64>"
    assert gqa.name_expressions(torch.bfloat16, 64, 8, 1, BULK)[0].startswith(
        "kvlab::gqa_decode<__nv_bfloat16, __nv_bfloat16, 64, 8, 1, ")
