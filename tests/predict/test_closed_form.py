"""The closed form (kvlab.predict.closed_form): a small launch's bytes and busiest SM by hand, the
time formula by hand, and the copy roofline of fewer SMs and of another GPU."""

import math

import pytest

from kvlab.gpus import gpu
from kvlab.predict.closed_form import FamilyFit, launch, sm_roofline_gbps, stack, time_s
from kvlab.predict.point import launch_point

BY_SMS = {32: 2272.8, 80: 3891.7, 132: 4280.7}
FIT = FamilyFit(launch_us=5.0, merge_us=3.0, efficiency=1.0, lone_gelems=10.0, sm_gelems=40.0,
                cta_tokens=100.0, p=2.0, l2_tbps=2.0,
                kappa={"v1": {"none": 0.5, "prefetch": 0.7}, "v2": {"none": 0.25,
                                                                    "prefetch": 0.7}},
                prefetch={"bulk K+V d=1": (2.0, 0.5)})


def test_gqa_split_launch_by_hand():
    # 8 query heads over 2 KV heads, head_dim 128, 2 sequences of 1,000 tokens, block 16
    x = launch(launch_point((8, 2, 128), 2, 1000), BY_SMS)
    kv = 2 * 1000 * 2 * 2 * 128 * 2  # sequences x tokens x KV heads x (K, V) x head_dim x fp16
    tables = 2 * math.ceil(1000 / 16) * 4  # int32 block ids
    q_out = 2 * 2 * 8 * 128 * 2  # q and out: sequences x query heads x head_dim x fp16
    # gqa splits 1,000 tokens into 4 partitions of 256 (split_plan): each (sequence,
    # partition, query head) writes fp32 [head_dim] and its max and sum, which the merge reads
    partials = 2 * 4 * 8 * (128 * 4 + 8) * 2
    assert x.kv_bytes == kv == 2_048_000
    assert x.dram_bytes == kv + tables + q_out + partials == 2_123_256
    assert x.reuse_bytes == 0  # a gqa CTA serves its whole group
    # 16 CTAs (2 sequences x 4 partitions x 2 KV heads) on 132 SMs: one each, 256 tokens
    assert (x.busy_tokens, x.busy_ctas, x.conc, x.split) == ((256, 256), (1, 1), 1, 1.0)
    assert (x.elements, x.roofline_gbps, x.clock, x.l2_scale) == (256, 4280.7, 1.0, 1.0)


def test_vllm_launch_by_hand():
    # v1 (vLLM's rule: one partition covers 100 tokens): 64 x 8 query heads = 512 CTAs, 4 an SM
    x = launch(launch_point((8, 2, 128), 64, 100, family="vllm_v1"), BY_SMS)
    kv = 64 * 100 * 2 * 2 * 128 * 2
    assert x.dram_bytes == kv + 64 * 7 * 4 + 2 * 64 * 8 * 128 * 2 == 6_817_536
    assert x.reuse_bytes == kv * 3  # the group's 3 other query heads read their KV head again
    assert (x.busy_tokens, x.busy_ctas, x.conc, x.split, x.partitioned) == (
        (400, 400), (4, 4), 4, 0.0, False)
    # v2: 2 sequences of 1,000 tokens in 512-token partitions, 32 CTAs, the longest 512 tokens
    x = launch(launch_point((8, 2, 128), 2, 1000, family="vllm_v1"), BY_SMS)
    assert x.partitioned and x.split == 1.0 and x.busy_tokens == (512, 512)
    assert x.dram_bytes == 2_048_000 + 504 + 8192 + 2 * 2 * 8 * 520 * 2


def test_waves_past_the_slots_cost_whole_waves():
    # 1,024 sequences x 32 query heads of vllm_v1 v1: 32,768 CTAs over 132 x 5 slots: 50 waves,
    # 5 CTAs an SM each
    x = launch(launch_point("llama2-7b", 1024, 512, family="vllm_v1"), BY_SMS)
    assert x.busy_ctas == (50 * 5, 50 * 5) and x.busy_tokens == (50 * 5 * 512,) * 2


def test_time_by_hand():
    point = launch_point((8, 2, 128), 2, 1000)
    x = stack([launch(point, BY_SMS)])
    t_hbm = 2_123_256 / 4280.7e9
    t_sm = (256 + 100) * 256 / 10e9  # one CTA an SM: a lone CTA's rate
    assert time_s(x, FIT)[0] == pytest.approx(8e-6 + math.hypot(t_hbm, t_sm))
    # prefetch: the SMs' rates x 2, the HBM rate x 0.5
    assert time_s(x, FIT, "bulk K+V d=1")[0] == pytest.approx(
        8e-6 + math.hypot(2 * t_hbm, t_sm / 2))


def test_time_of_a_group_rereading_through_l2():
    x = stack([launch(launch_point((8, 2, 128), 64, 100, family="vllm_v1"), BY_SMS)])
    kv = 64 * 100 * 2 * 2 * 128 * 2
    t_hbm = 6_817_536 / 4280.7e9
    t_sm = 4 * (100 + 100) * 256 / 40e9  # 4 CTAs an SM: min(4 x 10, 40) G elements/s
    t_l2 = kv * 3 * 0.5 / 2e12  # v1, no prefetch: kappa 0.5
    assert time_s(x, FIT)[0] == pytest.approx(5e-6 + math.sqrt(t_hbm**2 + t_sm**2 + t_l2**2))


def test_copy_roofline_of_fewer_sms_and_of_another_gpu():
    h200, h20 = gpu("h200"), gpu("h20")
    assert sm_roofline_gbps(h200, 80, BY_SMS) == 3891.7
    assert sm_roofline_gbps(h200, 106, BY_SMS) == pytest.approx((3891.7 + 4280.7) / 2)
    # the H20 on all 78 SMs: its assumed roofline (the H200's share of its spec: 4,280.7 of
    # 4,800 GB/s, of 4,000); on 39 SMs, the share 66 of the H200's SMs reach
    full = 4280.7 / 4800 * 4000
    assert sm_roofline_gbps(h20, 78, BY_SMS) == pytest.approx(full)
    half = 2272.8 + (66 - 32) / 48 * (3891.7 - 2272.8)
    assert sm_roofline_gbps(h20, 39, BY_SMS) == pytest.approx(full * half / 4280.7)
