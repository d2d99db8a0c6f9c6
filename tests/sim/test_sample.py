"""kvlab.sim.sample: a launch too big to replay live is replayed as a miniature whose hit rates
stand for the whole launch's, and whose counts are scaled up to it (CPU)."""

import re
from dataclasses import replace

import pytest

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.sim import L2Cache, simulate
from kvlab.sim.l2 import NUM_SETS
from kvlab.sim.plan import launch_spec
from kvlab.sim.sample import replay, sample_launch

NONE, BULK = PrefetchConfig(), PrefetchConfig("bulk")


def test_a_launch_within_the_budget_is_replayed_whole():
    sample = sample_launch("llama3-8b", "gqa", 4, 1024, 132, BULK, max_sectors=2**30)
    whole = launch_spec("llama3-8b", "gqa", 4, 1024, 132, BULK)
    assert sample.whole and sample.scale == 1 and sample.describe() == "the whole launch"
    assert (sample.spec, sample.num_sets) == (whole, NUM_SETS)
    assert replay(sample) == simulate(whole)


@pytest.mark.parametrize(("kernel", "batch", "context"), [("vllm_v1", 64, 4096),
                                                          ("gqa", 2, 32768)])
def test_the_miniature_is_planned_as_the_whole_launch(kernel, batch, context):
    whole = launch_spec("llama3-8b", kernel, batch, context, 132, BULK, block_size=32)
    sample = sample_launch("llama3-8b", kernel, batch, context, 132, BULK, 2**20,
                           block_size=32)
    planned = ("partition_size", "ctas_per_sm", "warps", "context", "block_size", "prefetch")
    assert [getattr(sample.spec, f) for f in planned] == [getattr(whole, f) for f in planned]
    assert not sample.whole and sample.spec.load_bytes <= 2**20 * 32
    assert sample.spec.num_sms < 132
    assert sample.num_sets == round(NUM_SETS * sample.spec.num_sms / 132)  # each SM's share


def test_the_estimate_is_the_whole_launchs_counts():
    sample = sample_launch("llama2-7b", "vllm_v1", 16, 2048, 132, BULK, 2**20)
    whole = launch_spec("llama2-7b", "vllm_v1", 16, 2048, 132, BULK)
    estimate, replayed = replay(sample), simulate(sample.spec, L2Cache(num_sets=sample.num_sets))
    assert sample.scale == 16 * 32 / (sample.spec.num_seqs * sample.spec.num_kv_heads) > 1
    assert estimate.demand_sectors * 32 == whole.load_bytes
    assert estimate.hit_rate == pytest.approx(replayed.hit_rate, abs=1e-6)


@pytest.mark.parametrize(("prefetch", "l2_mib"), [(PrefetchConfig("bulk", distance=4), 16),
                                                  (PrefetchConfig("line", distance=4), 16),
                                                  (PrefetchConfig("bulk", distance=1), 60)])
def test_the_miniature_keeps_the_hit_rate_where_a_subset_on_the_whole_gpu_does_not(
        prefetch, l2_mib):
    """Prefetched lines leave an L2 that the CTAs' rounds fill before the loads come: a subset
    of the sequences on all SMs and all of the L2 asks less of each set and keeps them."""
    args = ("llama3-8b", "gqa", 16, 1024, 132, prefetch)
    l2_bytes = l2_mib * 2**20
    whole = simulate(launch_spec(*args), L2Cache(num_sets=l2_bytes // 2048))
    sample = sample_launch(*args, max_sectors=whole.demand_sectors // 8, l2_bytes=l2_bytes)
    assert sample.spec.num_seqs == 2
    assert replay(sample).hit_rate == pytest.approx(whole.hit_rate, abs=0.03)
    subset = simulate(replace(sample.spec, num_sms=132), L2Cache(num_sets=l2_bytes // 2048))
    if l2_mib == 16:
        assert subset.hit_rate > whole.hit_rate + 0.5


@pytest.mark.parametrize(("model", "num_sms", "group"), [("llama3-8b", 132, 4),
                                                          ("qwen2.5-7b", 80, 7)])
def test_vllm_v1s_miniature_splits_query_head_groups_across_waves_as_the_gpu(model, num_sms,
                                                                            group):
    """vllm_v1 runs a KV head's query heads as consecutive CTAs: the miniature's CTA slots are
    the GPU's modulo the group."""
    for max_sectors in (2**18, 2**20, 2**22):
        sample = sample_launch(model, "vllm_v1", 32, 4096, num_sms, NONE, max_sectors)
        slots = sample.spec.num_sms * sample.spec.ctas_per_sm
        assert slots % group == num_sms * sample.spec.ctas_per_sm % group


def test_the_miniature_says_what_it_replays():
    sample = sample_launch("llama2-7b", "vllm_v1", 64, 4096, 132, NONE, 2**21)
    assert re.fullmatch(r"\d+ of 64 sequences on \d+ of 132 SMs", sample.describe())
    heads = sample_launch("llama2-7b", "vllm_v1", 4, 32768, 132, NONE, 2**21)
    assert re.fullmatch(r"1 of 4 sequences, \d+ of 32 KV heads on \d+ of 132 SMs",
                        heads.describe())
    assert heads.spec.num_qo_heads == heads.spec.num_kv_heads  # each KV head's query heads


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_sectors": 0}, "max_sectors=0: must be an integer >= 1"),
    ({"max_sectors": 1.5}, "max_sectors=1.5: must be an integer >= 1"),
    ({"l2_bytes": 100}, "l2_bytes=100: must be an integer >= 2048"),
    ({"batch": 0}, "batch=0: must be an integer >= 1"),
    ({"num_sms": True}, "num_sms=True: must be an integer >= 1"),
    ({"model": "llama9"}, "model='llama9': must be one of"),
    ({"block_size": 64}, "block_size=64: must be one of (8, 16, 32) for vllm_v1"),
    ({"context": 2**40}, "MAX_TRACE_BYTES"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, message):
    args = {"model": "llama2-7b", "kernel": "vllm_v1", "batch": 4, "context": 1024,
            "num_sms": 132, "prefetch": NONE, "max_sectors": 2**20} | kwargs
    with pytest.raises(ValueError, match=re.escape(message)):
        sample_launch(**args)


def test_replay_takes_only_a_sample():
    with pytest.raises(ValueError, match="sample='x': must be a kvlab.sim.sample.Sample"):
        replay("x")
