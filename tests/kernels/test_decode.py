"""The CUDA C decode kernels against kvlab.reference.decode_attention (GPU only), and the checks
that run before any launch (CPU)."""

import heapq
import math

import numpy as np
import pytest
import torch
from factories import force_gqa_warps

import kvlab
from kvlab.cache import PagedKVCache
from kvlab.checks import HEAD_DIMS
from kvlab.kernels import KERNEL_FAMILIES, gqa, select, tune, vllm_v1
from kvlab.kernels.decode import check_kernel
from kvlab.kernels.geometry import GQA_NUM_WARPS, GQA_WARP_TOKENS, gqa_row_bytes, gqa_stages
from kvlab.kernels.loader import load
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.reference import decode_attention as reference

FAMILIES = KERNEL_FAMILIES
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
BULK = PrefetchConfig("bulk")
PREFETCHES = [
    PrefetchConfig(), BULK, PrefetchConfig("line"), PrefetchConfig("bulk", v=False),
    PrefetchConfig("bulk", k=False), PrefetchConfig("bulk", distance=2),
    PrefetchConfig("bulk", distance=4), PrefetchConfig("line", distance=2),
    PrefetchConfig("line", distance=4), PrefetchConfig("bulk", evict_last=True),
    PrefetchConfig("line", evict_last=True),
]
NUM_KV_HEADS = 2
# Two batches per case: mixed lengths (long ones: v2 partitions / split-KV), and many short
# sequences (v1 / one partition per CTA); test_matches_reference checks each takes its path.
MIXED = [1, 17, 97, 3000, 3, 600]
MANY = [1 + (37 * i) % 256 for i in range(160)]


def case_grid():
    cases = []
    for kernel, family in FAMILIES.items():
        for dtype in TOLERANCE:
            for head_dim in HEAD_DIMS:
                cases.append((kernel, dtype, head_dim, 4, 16, PrefetchConfig()))
                cases.append((kernel, dtype, head_dim, 1, 16, BULK))
        cases += [(kernel, torch.float16, 128, group, 16, BULK) for group in range(1, 9)]
        for block_size in family.block_sizes:
            cases.append((kernel, torch.bfloat16, 128, 2, block_size, PrefetchConfig()))
            cases.append((kernel, torch.float16, 80, 3, block_size, PrefetchConfig("line")))
        cases += [(kernel, torch.float16, 128, 4, 16, p) for p in PREFETCHES]
    return list(dict.fromkeys(cases))


CASES = case_grid()


def case_id(case):
    kernel, dtype, head_dim, group, block_size, prefetch = case
    return f"{kernel}-{str(dtype)[6:]}-d{head_dim}-g{group}-b{block_size}-{prefetch.label()}"


def all_name_expressions(kernel):
    family = FAMILIES[kernel]
    names = []
    for k, dtype, head_dim, group, block_size, prefetch in CASES:
        if k != kernel:
            continue
        if kernel == "gqa":
            names += gqa.name_expressions(dtype, head_dim, block_size, group, prefetch)
        else:
            for part in (0, vllm_v1.PARTITION_SIZE):
                names += vllm_v1.name_expressions(dtype, head_dim, block_size, part, prefetch)
    return family.source, list(dict.fromkeys(names))


@pytest.fixture(scope="module")
def compiled():
    """Compile every instantiation the grid needs in one NVRTC call per family."""
    for kernel in FAMILIES:
        load(*all_name_expressions(kernel))


def make_batch(kernel, dtype, head_dim, block_size, lens, seed):
    """A cache filled with NaN, then sequences of random K/V scattered over it."""
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    cache = PagedKVCache(num_blocks, block_size, NUM_KV_HEADS, head_dim, dtype=dtype,
                         device="cuda", layout=FAMILIES[kernel].layout, seed=seed)
    cache.k_cache.fill_(math.nan)  # slots no sequence wrote must never reach the output
    cache.v_cache.fill_(math.nan)
    seq_ids = []
    for n in lens:
        k, v = (torch.randn(n, NUM_KV_HEADS, head_dim, device="cuda").to(dtype) for _ in "kv")
        seq_ids.append(cache.add_sequence(k, v))
    return cache, seq_ids


def rel_l2(out, ref):
    """The worst relative L2 error of any one sequence (row of the batch): an error confined to
    one short sequence must not hide in the norm of the whole batch."""
    diff = (out.float() - ref).flatten(1).norm(dim=1)
    return (diff / ref.flatten(1).norm(dim=1)).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_reference(case, compiled):
    kernel, dtype, head_dim, group, block_size, prefetch = case
    for lens, seed in ((MIXED, 0), (MANY, 1)):
        cache, seq_ids = make_batch(kernel, dtype, head_dim, block_size, lens, seed)
        q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, device="cuda").to(dtype)
        plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel=kernel, prefetch=prefetch)
        split = plan.launcher.num_partitions
        assert (split > 1) == (lens is MIXED), f"{kernel} split {split} ways for {lens[:6]}"
        if kernel == "gqa":  # mixed lengths, split or not: launched as a work list
            assert plan.launcher.work is not None
        out = plan.run(q, out=torch.full_like(q, math.nan))
        ref = reference(q, cache, seq_ids)
        assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs (lens {lens[:6]})"
        assert rel_l2(out, ref) < TOLERANCE[dtype], (lens[:6], rel_l2(out, ref))


# gqa with 8 warps a CTA (what split_plan picks where lone CTAs of 4 cannot keep HBM busy),
# forced at every length: each 16-bit dtype and head_dim it runs (not 256), groups, every block
# size, prefetch distances and evict-last
EIGHT_WARP_CASES = list(dict.fromkeys(
    [(dtype, d, 4, 16, PrefetchConfig()) for dtype in TOLERANCE for d in HEAD_DIMS if d != 256]
    + [(torch.float16, 128, g, 16, BULK) for g in (1, 3, 8)]
    + [(torch.float16, 80, 3, b, PrefetchConfig("line")) for b in gqa.FAMILY.block_sizes]
    + [(torch.float16, 128, 4, 16, p) for p in (
        PrefetchConfig("bulk", distance=2), PrefetchConfig("line", distance=4),
        PrefetchConfig("bulk", evict_last=True))]))
# equal lengths split in partitions with a short last one, equal lengths whole, mixed lengths
EIGHT_WARP_BATCHES = ([700] * 3, [300] * 5, MIXED)


@pytest.fixture(scope="module")
def compiled_8_warps():
    load(gqa.SOURCE, list(dict.fromkeys(
        n for dtype, d, g, b, p in EIGHT_WARP_CASES
        for n in gqa.name_expressions(dtype, d, b, g, p, warps=8))))


@pytest.mark.gpu
@pytest.mark.parametrize("case", EIGHT_WARP_CASES,
                         ids=lambda c: case_id(("gqa", *c)) + "-w8")
def test_gqa_with_8_warps_matches_reference(case, compiled_8_warps, monkeypatch):
    dtype, head_dim, group, block_size, prefetch = case
    force_gqa_warps(monkeypatch, 8)
    for seed, lens in enumerate(EIGHT_WARP_BATCHES):
        cache, seq_ids = make_batch("gqa", dtype, head_dim, block_size, lens, seed)
        q = torch.randn(len(lens), NUM_KV_HEADS * group, head_dim, device="cuda").to(dtype)
        plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel="gqa", prefetch=prefetch)
        assert plan.launcher.warps == 8
        out = plan.run(q, out=torch.full_like(q, math.nan))
        assert not out.isnan().any(), f"{out.isnan().sum().item()} NaN outputs (lens {lens[:6]})"
        assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[dtype], (lens[:6], case)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", FAMILIES)
def test_long_context(kernel):
    """32k tokens in one sequence: many partitions, and v2 beyond v1's 8k limit."""
    cache, seq_ids = make_batch(kernel, torch.float16, 128, 16, [32768, 5], seed=2)
    q = torch.randn(2, 8, 128, device="cuda", dtype=torch.float16)
    out = kvlab.decode_attention(q, cache, seq_ids, kernel=kernel, prefetch=BULK)
    assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[torch.float16]


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[1500] * 3, [200] * 80], ids=["split", "whole"])
def test_gqa_runs_equal_lengths_on_the_natural_grid(lens):
    cache, seq_ids = make_batch("gqa", torch.float16, 128, 16, lens, seed=5)
    q = torch.randn(len(lens), 8, 128, device="cuda", dtype=torch.float16)
    plan = kvlab.DecodePlan(cache, seq_ids, 8, kernel="gqa", prefetch=BULK)
    assert (plan.launcher.num_partitions > 1) == (lens[0] == 1500)
    assert plan.launcher.work is None
    assert rel_l2(plan.run(q), reference(q, cache, seq_ids)) < TOLERANCE[torch.float16]


@pytest.mark.gpu
def test_resident_ctas_are_what_the_l2_model_and_the_split_assume():
    """The L2 model runs vllm_v1's v1 and v2 at VLLM_CTAS_PER_SM CTAs an SM (registers, as
    vLLM's build holds them), and gqa's split fills geometry.ctas_per_sm (shared memory): the
    driver must agree for the models' shapes."""
    from kvlab.kernels.geometry import (
        VLLM_CTAS_PER_SM,
        ctas_per_sm,
        gqa_smem_bytes,
        vllm_smem_bytes,
    )
    from kvlab.kernels.launch import reserve_shared_memory, resident_ctas

    device = torch.device("cuda")
    for partition_size in (0, vllm_v1.PARTITION_SIZE):
        for prefetch in (PrefetchConfig(), PrefetchConfig("bulk"), PrefetchConfig("line")):
            names = vllm_v1.name_expressions(torch.float16, 128, 16, partition_size, prefetch)
            kernel = load(vllm_v1.SOURCE, names)[0]
            smem = vllm_smem_bytes(128, 16, partition_size, 4096)
            reserve_shared_memory(kernel, smem)
            assert resident_ctas(kernel, 128, smem, device) == VLLM_CTAS_PER_SM, (
                partition_size, prefetch)
    for group in (1, 4, 7):
        for warps in (4, 8):
            names = gqa.name_expressions(torch.float16, 128, 16, group, PrefetchConfig(),
                                         warps=warps)
            kernel = load(gqa.SOURCE, names)[0]
            smem = gqa_smem_bytes(128, 2, warps)
            reserve_shared_memory(kernel, smem)
            assert resident_ctas(kernel, 32 * warps, smem, device) == ctas_per_sm(128, 2, warps)


def captured(plan, q):
    """A CUDA graph of plan.run(q) into a new out, compiled and run once before the capture:
    (graph, out)."""
    out = torch.empty_like(q)
    plan.run(q, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, out=out)
    return graph, out


@pytest.mark.gpu
def test_gqa_split_replays_in_a_cuda_graph():
    """The merge is a programmatic dependent launch: it must capture into a graph, and each
    replay must merge the partials of its own decode launch (new q every time)."""
    cache, seq_ids = make_batch("gqa", torch.float16, 128, 16, [3000, 200], seed=7)
    plan = kvlab.DecodePlan(cache, seq_ids, 8, kernel="gqa")
    assert plan.launcher.num_partitions > 1
    assert plan.launcher.merged.tolist() == [0]  # the short one: written by its decode CTA
    q = torch.randn(2, 8, 128, device="cuda", dtype=torch.float16)
    graph, out = captured(plan, q)
    for seed in range(3):
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).half())
        out.fill_(math.nan)
        graph.replay()
        assert rel_l2(out, reference(q, cache, seq_ids)) < TOLERANCE[torch.float16]


@pytest.mark.gpu
def test_a_captured_split_plan_replays_batches_of_split_and_whole_sequences():
    """A plan for capture splits as if every sequence had max_seq_len tokens; at replay a
    sequence of one partition is written by its decode CTA and its merge CTAs return at once.
    Where none is split, only the merge's CTA (0, 0) waits for the decode grid."""
    cache, seq_ids = make_batch("gqa", torch.float16, 128, 16, [3000, 200, 5], seed=9)
    plan = kvlab.DecodePlan.for_capture(cache, 3, 3000, 8, kernel="gqa", prefetch=BULK)
    assert plan.launcher.num_partitions > 1 and plan.launcher.merged is None
    q = torch.randn(3, 8, 128, device="cuda", dtype=torch.float16)
    graph, out = captured(plan, q)
    for batch in ([0, 1, 2], [1, 2, 1], [2, 1, 0]):
        ids = [seq_ids[i] for i in batch]
        tables = cache.block_tables(ids)
        plan.block_tables[:, :tables.shape[1]] = tables
        plan.seq_lens.copy_(cache.seq_lens(ids))
        out.fill_(math.nan)
        graph.replay()
        assert rel_l2(out, reference(q, cache, ids)) < TOLERANCE[torch.float16], batch


@pytest.mark.gpu
def test_plan_runs_per_layer_on_other_tensors_of_the_same_shape():
    cache, seq_ids = make_batch("gqa", torch.float16, 64, 16, [40, 7], seed=3)
    plan = kvlab.DecodePlan(cache, seq_ids, num_qo_heads=4, kernel="gqa")
    q = torch.randn(2, 4, 64, device="cuda", dtype=torch.float16)
    first = plan.run(q)
    k2, v2 = cache.k_cache.clone(), cache.v_cache.clone()
    cache.k_cache.mul_(2)  # a different "layer"
    torch.testing.assert_close(plan.run(q, k2, v2), first)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", FAMILIES)
def test_a_plan_for_shorter_sequences_leaves_an_earlier_plan_working(kernel):
    """Plans share each compiled kernel and its shared-memory limit (vllm_v1's grows with the
    longest sequence): a later plan for shorter sequences must not shrink it."""
    cache, seq_ids = make_batch(kernel, torch.float16, 128, 16, [500, 100], seed=6)
    q = torch.randn(1, 4, 128, device="cuda", dtype=torch.float16)
    long = kvlab.DecodePlan(cache, seq_ids[:1], 4, kernel=kernel)
    short = kvlab.DecodePlan(cache, seq_ids[1:], 4, kernel=kernel)
    for plan, seq_id in ((long, seq_ids[0]), (short, seq_ids[1])):
        assert rel_l2(plan.run(q), reference(q, cache, [seq_id])) < TOLERANCE[torch.float16]


@pytest.mark.gpu
def test_run_checks_its_tensors():
    cache, seq_ids = make_batch("gqa", torch.float16, 64, 16, [40], seed=4)
    plan = kvlab.DecodePlan(cache, seq_ids, num_qo_heads=2)
    q = torch.randn(1, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match=r"q.shape=\(1, 4, 64\): must be \(1, 2, 64\)"):
        plan.run(torch.randn(1, 4, 64, device="cuda", dtype=torch.float16))
    with pytest.raises(ValueError, match="q.dtype=torch.float32"):
        plan.run(q.float())
    with pytest.raises(ValueError, match="q: must be contiguous"):
        plan.run(torch.randn(1, 2, 128, device="cuda", dtype=torch.float16)[..., ::2])
    with pytest.raises(ValueError, match="k_cache.shape="):
        plan.run(q, cache.k_cache[:1], cache.v_cache)
    with pytest.raises(ValueError, match="q.device=cpu"):
        plan.run(q.cpu())
    offset = torch.empty(1 + q.numel(), device="cuda", dtype=torch.float16)[1:].view(q.shape)
    with pytest.raises(ValueError, match="out: must start on a 16-byte boundary, starts 2 bytes"):
        plan.run(q, out=offset)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", FAMILIES)
def test_split_merge_rescales_to_a_dominant_token(kernel):
    """One token of a late partition whose logit for query head 0 exceeds the others by ~45
    (natural log): the merge must weigh every partition against it, so that head 0's output is
    that token's V, while the group's other heads still average over the whole sequence."""
    torch.manual_seed(6)
    n, token, group = 32768, 30001, 4
    cache = PagedKVCache(n // 16, 16, NUM_KV_HEADS, 128, dtype=torch.float16, device="cuda",
                         layout=FAMILIES[kernel].layout)
    q = torch.randn(1, NUM_KV_HEADS * group, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(n, NUM_KV_HEADS, 128, device="cuda", dtype=torch.float16) for _ in "kv")
    k[token] = 4 * q[0, ::group]  # KV head h: 4 x the first query head of its group
    seq_ids = [cache.add_sequence(k, v)]
    plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel=kernel)
    assert plan.launcher.num_partitions > 8
    out = plan.run(q, out=torch.full_like(q, math.nan))
    ref = reference(q, cache, seq_ids)
    assert torch.allclose(ref[0, ::group], v[token].float(), atol=1e-3)  # the premise
    per_head = (out.float() - ref).norm(dim=-1) / ref.norm(dim=-1)  # head 0 would hide the rest
    assert per_head.max().item() < TOLERANCE[torch.float16], per_head


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", FAMILIES)
def test_softmax_follows_rising_logits(kernel):
    """The lead query head of each group sees its logits climb by 3 (natural log, 4.3 in log2)
    every 64 tokens and jump by 15 at token 3000: gqa's running max moves past its lazy-rescale
    slack (8 in log2) every other 64-token tile and at the jump, and stays within it in between,
    so the output must follow every rescale and every skipped one."""
    torch.manual_seed(7)
    n, group = 4096, 4
    cache = PagedKVCache(n // 16, 16, NUM_KV_HEADS, 128, dtype=torch.float16, device="cuda",
                         layout=FAMILIES[kernel].layout)
    q = torch.randn(1, NUM_KV_HEADS * group, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(n, NUM_KV_HEADS, 128, device="cuda", dtype=torch.float16) for _ in "kv")
    lead = q[0, ::group].float()  # the first query head of each KV head's group
    t = torch.arange(n, device="cuda")
    rise = t * (3.0 / 64) + 15.0 * (t >= 3000)
    # k . lead * 128^-0.5 gains rise[t]
    k += (rise[:, None, None] * 128**0.5 * lead / lead.norm(dim=-1, keepdim=True) ** 2).half()
    seq_ids = [cache.add_sequence(k, v)]
    plan = kvlab.DecodePlan(cache, seq_ids, q.shape[1], kernel=kernel)
    out = plan.run(q, out=torch.full_like(q, math.nan))
    ref = reference(q, cache, seq_ids)
    per_head = (out.float() - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert per_head.max().item() < TOLERANCE[torch.float16], per_head


def cpu_cache(layout="hnd", block_size=16, num_kv_heads=2, dtype=torch.float16):
    return PagedKVCache(4, block_size, num_kv_heads, 64, dtype=dtype, layout=layout)


@pytest.mark.parametrize(
    ("kernel", "cache", "num_qo_heads", "message"),
    [
        ("vllm_v1", cpu_cache("hnd"), 2, "cache.layout='hnd': kernel='vllm_v1' reads the 'vllm'"),
        ("gqa", cpu_cache("vllm"), 2, "cache.layout='vllm': kernel='gqa' reads the 'hnd'"),
        ("vllm_v1", cpu_cache("vllm", 64), 2, r"block_size=64: kernel='vllm_v1' supports \(8, 16"),
        ("gqa", cpu_cache("hnd", 4), 2, r"block_size=4: kernel='gqa' supports \(8, "),
        ("gqa", cpu_cache("hnd", num_kv_heads=1), 9, "= 9: kernel='gqa' supports groups 1 to 8"),
        ("flash", cpu_cache(), 2, "kernel='flash': must be one of"),
    ],
)
def test_unsupported_combinations_are_refused(kernel, cache, num_qo_heads, message):
    with pytest.raises(ValueError, match=message):
        check_kernel(kernel, cache, num_qo_heads)


def test_plan_refuses_what_no_kernel_runs():
    q = torch.randn(1, 2, 64, dtype=torch.float16)
    cache = cpu_cache()
    seq_id = cache.add_sequence(*torch.randn(2, 3, 2, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="cache.device=cpu: the CUDA kernels need a CUDA device"):
        kvlab.decode_attention(q, cache, [seq_id])
    with pytest.raises(ValueError, match="q: must be a 3-d torch.Tensor"):
        kvlab.decode_attention(q[0], cache, [seq_id])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "tma"}, r"mode='tma': must be one of \('none', 'bulk', 'line'\)"),
        ({"distance": 0}, r"distance=0: must be an integer in \[1, 16\]"),
        ({"distance": 2.0}, r"distance=2.0"),
        ({"k": 1}, "k=1: must be a bool"),
    ],
)
def test_prefetch_config_validates(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrefetchConfig(**kwargs)


def test_disabled_prefetch_configs_share_one_instantiation():
    assert PrefetchConfig().template_args() == PrefetchConfig("bulk", k=False, v=False,
                                                             distance=3).template_args()
    assert PrefetchConfig("line", v=False, distance=2, evict_last=True).template_args() == (
        "kvlab::PF_LINE, true, false, 2, true"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["vllm", "hnd"])
def test_auto_times_the_candidates_once_per_bucket(layout, monkeypatch):
    monkeypatch.setattr(tune, "_choices", {})
    monkeypatch.setattr(tune, "measured", {})
    kernel = "vllm_v1" if layout == "vllm" else "gqa"
    cache, seq_ids = make_batch(kernel, torch.float16, 128, 16, [1000, 17, 3, 40], seed=5)
    q = torch.randn(3, 8, 128, device="cuda", dtype=torch.float16)
    plan = kvlab.DecodePlan(cache, seq_ids[:3], 8)
    assert plan.kernel == kernel
    ((key, times),) = tune.measured.items()
    assert set(times) == {c.label() for c in tune.CANDIDATES}
    assert plan.prefetch in tune.CANDIDATES
    assert rel_l2(plan.run(q), reference(q, cache, seq_ids[:3])) < TOLERANCE[torch.float16]
    # Same bucket (batch 3 and 4 -> 4, longest 1000 -> 1024): nothing is measured again.
    again = kvlab.DecodePlan(cache, seq_ids, 8)
    assert again.prefetch == plan.prefetch
    assert tune.measured == {key: times}


@pytest.mark.gpu
def test_autotune_off_takes_the_recorded_choice(monkeypatch):
    monkeypatch.setenv("KVLAB_AUTOTUNE", "0")
    monkeypatch.setattr(tune, "measured", {})
    cache, seq_ids = make_batch("gqa", torch.float16, 128, 16, [1000, 17, 3], seed=5)
    plan = kvlab.DecodePlan(cache, seq_ids, 8)
    assert plan.prefetch == select.best_prefetch("gqa", 8, 2, 16, 3, 1000)
    assert tune.measured == {}


def runs(median, spread=0.02, n=30):
    """n timed runs around `median`, spread evenly over +-spread (relative)."""
    return [median * (1 + spread * (2 * i / (n - 1) - 1)) for i in range(n)]


def test_auto_keeps_no_prefetch_unless_a_setting_wins_by_more_than_the_spread():
    bulk, line = PrefetchConfig("bulk"), PrefetchConfig("line", distance=2)
    # 1% faster by the median, inside a +-2% spread: noise
    assert tune.choose({tune.NO_PREFETCH: runs(10.0), bulk: runs(9.9)}) == tune.NO_PREFETCH
    # 5% faster, the spreads apart: a win
    assert tune.choose({tune.NO_PREFETCH: runs(10.0), bulk: runs(9.5)}) == bulk
    # of two winners, the lower median
    assert tune.choose({tune.NO_PREFETCH: runs(10.0), bulk: runs(9.5),
                        line: runs(9.4, spread=0.005)}) == line
    # a slower setting never wins
    assert tune.choose({tune.NO_PREFETCH: runs(10.0), bulk: runs(12.0)}) == tune.NO_PREFETCH


def test_autotune_setting_is_checked(monkeypatch):
    monkeypatch.setenv("KVLAB_AUTOTUNE", "yes")
    with pytest.raises(ValueError, match="KVLAB_AUTOTUNE='yes': must be '0' or '1'"):
        tune.enabled()


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "max_seq_len", "expected"),
    [
        # 128 (sequence, KV head) pairs, one an SM unsplit (a lone CTA keeps up on 132 SMs):
        # 32,768 + 128 = 32,896 token-times against 2 x 16,384 + 128 + 256 = 33,152 in 2
        # partitions (two an SM, their overheads overlapping)
        (16, 8, 32768, 32768),
        # the same pairs at 1k: unsplit 1,152 against 2 x 512 + 128 + 256 = 1,408
        (16, 8, 1024, 1024),
        (128, 8, 32768, 32768),  # 1024 CTAs already fill the GPU: no split
        # one sequence: 32 partitions, 256 CTAs two an SM, 2 x 1,024 + 128 + 256 = 2,432, as
        # much as 16 partitions one an SM (2,048 + 128 + 256): the pair wins the tie
        (1, 8, 32768, 1024),
        (16, 4, 1024, 256),  # 64 pairs: 4 partitions, 256 CTAs (the same tie against 2)
        (160, 2, 256, 256),  # short sequences: one partition
    ],
)
def test_gqa_split_counts_the_turns_of_an_sm_and_the_merge(num_seqs, num_kv_heads, max_seq_len,
                                                            expected):
    assert gqa.ctas_per_sm(128) == 2
    assert gqa.split_plan(num_seqs, num_kv_heads, max_seq_len, 132, 2, 512) == (expected, 4)
    assert gqa.split_plan(num_seqs, num_kv_heads, max_seq_len, 132, 2, 512,
                          [max_seq_len] * num_seqs) == (expected, 4)


def test_gqa_split_splits_where_a_lone_cta_cannot_keep_up():
    """A lone CTA an SM handles 86M tokens/s, two 113M. On 80 SMs with fp16 K and V (512 bytes a
    token at head_dim 128) lone CTAs read 1.22x slower than pairs, whom HBM's 4.28 TB/s then
    limits: llama3-8b 8 x 4k, unsplit 64 CTAs, 1.22 x 4,096 + 128 = 5,105 token-times against
    2 x 2,048 + 128 + 256 = 4,480 in 2 partitions. On the whole GPU 132 lone CTAs outrun HBM
    (the test above), unless the cache is fp8: at 256 bytes a token HBM gives twice the tokens,
    and 16 x 32k splits in two."""
    from kvlab.kernels.geometry import lone_cta_slowdown

    assert lone_cta_slowdown(132, 512) == 1.0
    assert lone_cta_slowdown(80, 512) == pytest.approx(4280e9 / 512 / (80 * 86e6))
    assert lone_cta_slowdown(32, 512) == pytest.approx(113 / 86)
    assert lone_cta_slowdown(132, 256) == pytest.approx(113 / 86)
    assert gqa.split_plan(8, 8, 4096, 80, 2, 512) == (2048, 4)
    assert gqa.split_plan(16, 8, 32768, 132, 2, 512) == (32768, 4)
    assert gqa.split_plan(16, 8, 32768, 132, 2, 256) == (16384, 4)


@pytest.mark.parametrize(
    ("num_seqs", "num_kv_heads", "max_seq_len", "num_sms", "token_bytes", "expected"),
    [
        # fp8, 128 lone CTAs of 4 warps read 128 x 86M = 11.0G tokens/s, below HBM's 16.7G
        # (4.28 TB/s at 256 bytes a token): 8 warps read like a pair, 113M, or 90% of a 128th
        # of HBM, 118M: 113 / 113 x 32,768 + 128 = 32,896 token-times against 2 x 16,384 + 128
        # + 256 = 33,152 split in two (the choice without 8 warps, above)
        (16, 8, 32768, 132, 256, (32768, 8)),
        (16, 8, 8192, 132, 256, (8192, 8)),
        # fp16, 64 lone CTAs (qwen2.5-7b 16 x 1k): 5.5G tokens/s of 8.36G; 8 warps 63.3 / 113 x
        # 1,024 + 128 = 702 against 4 partitions of 256 two an SM, 2 x 256 + 128 + 256 = 896
        (16, 4, 1024, 132, 512, (1024, 8)),
        # fp16, 128 lone CTAs of 4 warps keep HBM busy (11.0G of 8.36G): 4 warps
        (16, 8, 8192, 132, 512, (8192, 4)),
        # one sequence: 8 warps only where few CTAs are lone; the pairs of 1,024 win as before
        (1, 8, 32768, 132, 512, (1024, 4)),
        # 32 SMs read 3.6G tokens/s as pairs; 32 lone CTAs of 4 warps 2.75G, of 8 like pairs:
        # 4,096 + 128 against 2 x 2,048 + 128 + 256 split in pairs
        (1, 32, 4096, 32, 512, (4096, 8)),
        # 80 SMs: 80 lone CTAs of 8 warps at 90% of an 80th of HBM, 94M tokens/s, against the
        # pairs' 104.5M: 1.11 x 3,328 + 384 = 4,082 against 2 x 1,792 + 384 = 3,968 in pairs
        (1, 8, 32768, 80, 512, (1792, 4)),
        # partitions under 512 tokens keep 4 warps (1 x 1k: 4 x 256 tokens, 32 lone CTAs)
        (1, 8, 1024, 132, 512, (256, 4)),
    ],
)
def test_gqa_split_runs_8_warps_where_lone_ctas_of_4_cannot_keep_hbm_busy(
        num_seqs, num_kv_heads, max_seq_len, num_sms, token_bytes, expected):
    assert gqa.split_plan(num_seqs, num_kv_heads, max_seq_len, num_sms, 2, token_bytes,
                          eight_warps=True) == expected
    # without room for 8 warps (head_dim 256), or on mixed lengths: 4
    assert gqa.split_plan(num_seqs, num_kv_heads, max_seq_len, num_sms, 2,
                          token_bytes).warps == 4
    lens = [max_seq_len] * (num_seqs - 1) + [max_seq_len // 2] if num_seqs > 1 else [1, 2]
    assert gqa.split_plan(len(lens), num_kv_heads, max(lens), num_sms, 2, token_bytes, lens,
                          eight_warps=True).warps == 4


def test_gqa_splits_a_mixed_batch_by_the_work_it_holds():
    """64 sequences, one of 16k and the rest 1k. As if all were 16k, 512 CTAs fill two waves and
    no split pays. By their lengths (the mixed model: the CTAs given out longest first to 264
    slots, 33 groups of 8, each CTA lasting its tokens + 256, a split adding 768): unsplit, the
    16k CTAs last 16,640 token-times; in partitions of 1,024, 2,048 or 3,328 tokens the slots
    come free at 3,840, + 768 = 4,608 (3,328: 4 whole partitions and 3,072 tokens, on 5 groups,
    then the 63 short sequences, 28 groups x 2 and 7 x 3). Of the ties the fewest partitions
    win. A short mixed batch (max 2k) runs whole: 2,560 either way, and a split adds the merge.
    """
    from kvlab.kernels.geometry import _longest_first_makespan

    lens = np.array([16384] + [1024] * 63)
    assert [_longest_first_makespan(lens, 8, size, 264) for size in (1024, 2048, 3328, 4096)] == [
        3840, 3840, 3840, 4352]
    assert gqa.split_plan(64, 8, 16384, 132, 2, 512) == (16384, 4)
    assert gqa.split_plan(64, 8, 16384, 132, 2, 512, lens) == (3328, 4)
    assert gqa.split_plan(64, 8, 2048, 132, 2, 512, [2048] + [1024] * 63) == (2048, 4)


def test_gqa_pairs_long_and_short_ctas_an_sm_only_in_one_wave():
    from kvlab.kernels.geometry import one_wave_order, work_list

    work = work_list(list(range(100, 0, -1)), 256)  # 100 items, longest first
    # 100 x 2 KV heads = 200 CTAs on 132 SMs of 2 slots: the items of the first 132 CTAs (66)
    # longest first, the other 34 shortest first
    paired = one_wave_order(work, 2, 132, 2)
    assert paired[:66].tolist() == work[:66].tolist()
    assert paired[66:].tolist() == work[66:][::-1].tolist()
    # 100 x 3 = 300 CTAs > 264 slots: unchanged
    assert one_wave_order(work, 3, 132, 2) is work


@pytest.mark.parametrize("seed", range(4))
def test_gqa_mixed_makespan_is_the_longest_first_schedule_of_every_cta(seed):
    """The model's groups of gcd(slots, KV heads) slots against the schedule itself: every CTA
    (each work item num_kv_heads times, longest first) to the slot free soonest."""
    from kvlab.kernels.geometry import MIXED_CTA_OVERHEAD_TOKENS, _longest_first_makespan

    rng = np.random.default_rng(seed)
    for _ in range(40):
        lens = rng.integers(0, 5000, int(rng.integers(1, 40)))
        size, heads = int(rng.choice([256, 768, 2048])), int(rng.choice([1, 4, 5, 8, 32]))
        slots = int(rng.choice([7, 156, 264]))
        ctas = [min(size, n - p * size) for n in lens.tolist()
                for p in range(max(1, -(-n // size)))]
        free_at = [0] * slots
        for tokens in sorted(ctas, reverse=True):
            for _ in range(heads):
                heapq.heapreplace(free_at, free_at[0] + tokens + MIXED_CTA_OVERHEAD_TOKENS)
        assert _longest_first_makespan(lens, heads, size, slots) == max(free_at)


def test_gqa_work_list_holds_the_partitions_with_tokens_longest_first():
    from kvlab.kernels.geometry import work_list

    # tokens per partition of 256: seq 0: 5; seq 1: 256, 256, 188; seq 2: none; seq 3: 256, 44
    assert work_list([5, 700, 0, 300], 256).tolist() == [
        [1, 0], [1, 1], [3, 0], [1, 2], [3, 1], [0, 0], [2, 0]]


@pytest.mark.parametrize("kv_bytes", [1, 2])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gqa_rows_are_whole_lines_or_an_odd_multiple_of_32_bytes(head_dim, kv_bytes):
    """gqa_decode's shared-memory rows, as the launcher sizes them: unpadded where a 16-bit row
    fills whole 128-byte lines (its chunks are swizzled), else a multiple of 32 bytes (each cache
    sector lands in one shared-memory sector, so L2 serves it once) and an odd one (an ldmatrix
    phase meets at most a 2-way bank conflict); room for the row, and for the 16 bytes fp8's
    last ldmatrix reads past it at head_dim 80 and 112. test_nvcc checks the kernel's side."""
    row = gqa.smem_bytes(head_dim, kv_bytes) // (gqa_stages(kv_bytes) * GQA_NUM_WARPS * 2
                                                  * GQA_WARP_TOKENS)
    assert row == gqa_row_bytes(head_dim, kv_bytes)
    need = head_dim * kv_bytes + (16 if kv_bytes == 1 and head_dim in (80, 112) else 0)
    if kv_bytes == 2 and need % 128 == 0:
        assert row == need
    else:
        assert row % 32 == 0 and (row // 32) % 2 == 1 and need <= row < need + 64
