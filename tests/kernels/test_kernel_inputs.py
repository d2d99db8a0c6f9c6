"""Hostile values at the kernels' entry points: every check runs on the host, before anything is
allocated on the GPU or launched, and raises a ValueError naming the parameter. CPU: the GPU-only
wrappers are called on CPU (or "meta") caches, with the CUDA device check stubbed out where a
check behind it is under test, so that a check that does not fire reaches the GPU and fails."""

import math
import re

import numpy as np
import pytest
import torch

import kvlab
from kvlab.cache import PagedKVCache
from kvlab.kernels import decode, geometry, layer_ops, loader, select
from kvlab.kernels import timeline as kernel_timeline
from kvlab.kernels.numba_decode import decode_attention_numba
from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.kernels.read import PlainRead


def cpu_cache(layout="hnd", num_blocks=4, block_size=16, device="cpu"):
    return PagedKVCache(num_blocks, block_size, 2, 64, dtype=torch.float16, layout=layout,
                        device=device)


def cache_with_sequence(layout="hnd"):
    cache = cpu_cache(layout)
    seq_id = cache.add_sequence(*torch.randn(2, 3, 2, 64, dtype=torch.float16))
    return cache, seq_id


@pytest.fixture
def no_device_check(monkeypatch):
    """DecodePlan's checks past the cache's device, on a CPU cache: a check that lets a bad
    value through reaches the GPU (and fails otherwise than with its ValueError)."""
    monkeypatch.setattr(decode, "_check_cache", lambda cache: None)


@pytest.mark.parametrize("scale", [math.nan, math.inf, True, "0.1", 1e39, -1e300])
def test_plan_refuses_a_scale_the_kernels_cannot_take(scale, no_device_check):
    cache, seq_id = cache_with_sequence()
    with pytest.raises(ValueError, match=re.escape(f"scale={scale!r}: must be a finite")):
        kvlab.DecodePlan(cache, [seq_id], 2, scale=scale)


@pytest.mark.parametrize("num_sms", [0, True, 2.5, "8"])
def test_plan_refuses_a_num_sms_that_is_not_a_count(num_sms, no_device_check):
    cache, seq_id = cache_with_sequence()
    with pytest.raises(ValueError, match=re.escape(f"num_sms={num_sms!r}: must be an integer")):
        kvlab.DecodePlan(cache, [seq_id], 2, num_sms=num_sms)


def test_plan_refuses_more_sequences_than_a_grid_holds(no_device_check):
    cache, seq_id = cache_with_sequence()
    with pytest.raises(ValueError, match="num_seqs=65536: the kernels decode at most 65535"):
        kvlab.DecodePlan(cache, [seq_id] * 65536, 2)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_seqs": 65536, "max_seq_len": 16}, "num_seqs=65536: the kernels decode at most 65535"),
    ({"num_seqs": 2**70, "max_seq_len": 16}, f"num_seqs={2**70}: the kernels decode at most"),
    ({"num_seqs": 1, "max_seq_len": 65}, "max_seq_len=65: the cache holds at most 64 tokens"),
    ({"num_seqs": 1, "max_seq_len": 2**70}, f"max_seq_len={2**70}: the cache holds at most 64"),
    ({"num_seqs": 1, "max_seq_len": 16, "scale": math.nan}, "scale=nan"),
])
def test_a_capture_plan_is_checked_before_its_tables_are_allocated(kwargs, message,
                                                                   no_device_check):
    with pytest.raises(ValueError, match=re.escape(message)):
        kvlab.DecodePlan.for_capture(cpu_cache(), num_qo_heads=2, **kwargs)


def test_vllm_v1_refuses_sequences_of_more_partitions_than_a_grid_holds(no_device_check):
    # 2**20 blocks of 32 tokens: a sequence of 65,535 x 512 + 1 tokens fits the cache, not
    # vllm_v1's grid (one partition of 512 tokens a CTA along its z dimension)
    cache = PagedKVCache(2**20, 32, 1, 64, dtype=torch.float16, layout="vllm", device="meta")
    limit = geometry.MAX_GRID_YZ * geometry.PARTITION_SIZE
    with pytest.raises(ValueError, match=rf"max_seq_len={limit + 1}: kernel='vllm_v1' runs "):
        kvlab.DecodePlan.for_capture(cache, 1, limit + 1, 1, kernel="vllm_v1")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_sms": 0}, "num_sms=0"), ({"ctas_per_sm": 0}, "ctas_per_sm=0"),
    ({"token_bytes": 0}, "token_bytes=0"), ({"max_seq_len": 0}, "max_seq_len=0"),
    ({"max_seq_len": -5}, "max_seq_len=-5"), ({"num_seqs": 0}, "num_seqs=0"),
    ({"num_kv_heads": 2.0}, "num_kv_heads=2.0"), ({"num_sms": True}, "num_sms=True"),
    ({"max_seq_len": 2**31}, "max_seq_len=2147483648"),
    ({"num_seqs": 2, "seq_lens": []}, "seq_lens=[]"),
    ({"num_seqs": 2, "seq_lens": [-3, 1024]}, "seq_lens=[-3, 1024]"),
    ({"num_seqs": 2, "seq_lens": [3, 100]}, "seq_lens=[3, 100]"),
    ({"num_seqs": 2, "seq_lens": [3.5, 1024]}, "seq_lens=[3.5, 1024]"),
])
def test_split_plan_refuses_what_no_launch_has(kwargs, message):
    args = {"num_seqs": 4, "num_kv_heads": 8, "max_seq_len": 1024, "num_sms": 132,
            "ctas_per_sm": 2, "token_bytes": 512, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        geometry.split_plan(**args)


def test_split_plan_takes_numpy_counts():
    args = (np.int64(4), np.int32(8), np.int64(1024), np.int64(132), np.int64(2), np.int64(512))
    assert geometry.split_plan(*args) == geometry.split_plan(4, 8, 1024, 132, 2, 512)


@pytest.mark.parametrize(("args", "message"), [((0, 512), "num_sms=0"),
                                               ((132, 0), "token_bytes=0")])
def test_lone_cta_slowdown_refuses_zero_counts(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        geometry.lone_cta_slowdown(*args)


def test_work_list_refuses_an_empty_partition():
    with pytest.raises(ValueError, match=re.escape("size=0: must be an integer >= 1")):
        geometry.work_list([3, 5], 0)


@pytest.mark.parametrize(("args", "message"), [
    (("gqa", 8, 0, 16, 4, 1024), "num_kv_heads=0"),
    (("gqa", 2, 8, 16, 4, 1024), "num_qo_heads=2: must be divisible by num_kv_heads=8"),
    (("gqa", 8, 2, 0, 4, 1024), "block_size=0"),
    (("gqa", 8, 2, 16, 0, 1024), "batch=0"),
    (("gqa", 8, 2, 16, math.nan, 1024), "batch=nan"),
    (("gqa", 8, 2, 16, 4, -1), "context=-1"),
])
def test_recorded_choice_refuses_shapes_no_plan_has(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        select.best_prefetch(*args)


def test_prefetch_config_takes_numpy_values_as_python_ones():
    config = PrefetchConfig("bulk", k=np.True_, v=np.False_, distance=np.int64(2))
    assert config == PrefetchConfig("bulk", k=True, v=False, distance=2)
    assert type(config.distance) is int and config.k is True and config.v is False
    assert config.template_args() == "kvlab::PF_BULK, true, false, 2, false"


def test_plain_read_refuses_a_device_that_is_not_a_gpu():
    with pytest.raises(ValueError, match="device='cpu': the read kernel needs a CUDA device"):
        PlainRead(256, device="cpu")


def test_tracer_checks_its_read_before_planning():
    cache, seq_id = cache_with_sequence()
    with pytest.raises(ValueError, match=re.escape("num_bytes=7: must be a positive multiple")):
        kernel_timeline.Tracer(cache, [seq_id], 2, 7)


@pytest.mark.parametrize("eps", [math.nan, -1e-6, 0.0, True, 1e39])
def test_rms_norm_refuses_an_eps_that_is_not_a_small_number(eps):
    x = torch.zeros(2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=re.escape(f"eps={eps!r}: must be a finite number")):
        layer_ops.rms_norm(x, torch.ones(64, dtype=torch.float16), eps)


@pytest.mark.parametrize("filename", ["../README.md", "/etc/passwd", "sub/x.cu", ""])
def test_loader_reads_only_the_kernel_sources(filename):
    with pytest.raises(ValueError, match=re.escape(f"filename={filename!r}: must be the name")):
        loader.load(filename, ["kernel"])


def numba_inputs(num_qo_heads=2):
    rng = np.random.default_rng(0)
    return {"q": rng.standard_normal((2, num_qo_heads, 32)).astype(np.float32),
            "k_cache": rng.standard_normal((4, 1, 4, 32)).astype(np.float32),
            "v_cache": rng.standard_normal((4, 1, 4, 32)).astype(np.float32),
            "block_tables": np.array([[0, 1], [2, 3]], np.int32),
            "seq_lens": np.array([3, 8], np.int32)}


@pytest.mark.parametrize(("change", "message"), [
    ({"prefetch_distance": 2**31}, "prefetch_distance=2147483648: must be an integer in [0, 16]"),
    ({"prefetch_distance": 17}, "prefetch_distance=17: must be an integer in [0, 16]"),
    ({"scale": 1e39}, "scale=1e+39: must be a finite number"),
    ({"scale": np.float64(-1e300)}, "scale=np.float64(-1e+300): must be a finite number"),
    ({"q": numba_inputs(0)["q"]}, "num_qo_heads=0: must be a multiple of num_kv_heads=1 and"),
])
def test_numba_decode_refuses_values_its_kernel_cannot_take(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        decode_attention_numba(**{**numba_inputs(), **change})
