"""The model's inputs (kvlab.predict.point): every bad value refused by name before any work, and
the good ones resolved."""

import re

import numpy as np
import pytest

from kvlab.kernels.prefetch import PrefetchConfig
from kvlab.predict import decode_launch
from kvlab.predict.point import launch_point


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((("7", 2, 128), 1, 1024), {}, "num_qo_heads='7': must be an integer >= 1"),
    (((7, 2, 128), 1, 1024), {}, "num_qo_heads=7: must be divisible by num_kv_heads=2"),
    (((32, 2, 128), 1, 1024), {}, "num_qo_heads=32, num_kv_heads=2: the kernels take 1 to 8 "
                                  "query heads a KV head"),
    (((8, 2, 100), 1, 1024), {}, "head_dim=100: must be an integer, one of"),
    (((8, 2), 1, 1024), {}, "model_or_shape=(8, 2): must be a model name of"),
    (("llama9", 1, 1024), {}, "model_or_shape='llama9': must be one of"),
    (("llama3-8b", 0, 1024), {}, "batch=0: must be an integer in [1, 65535]"),
    (("llama3-8b", 70000, 8), {}, "batch=70000: must be an integer in [1, 65535]"),
    (("llama3-8b", 1, 0), {}, "context=0: must be an integer in [1, 2147483647]"),
    (("llama3-8b", 1, 1.5), {}, "context=1.5: must be an integer"),
    (("llama3-8b", 1, 1024), {"family": "flash"}, "family='flash': must be one of ('vllm_v1', "
                                                  "'gqa')"),
    (("llama3-8b", 1, 1024), {"family": "vllm_v1", "block_size": 64},
     "block_size=64: must be one of (8, 16, 32) for family='vllm_v1'"),
    (("llama3-8b", 1, 1024), {"block_size": 48}, "block_size=48: must be one of (8, 16, 32, 64, "
                                                 "128, 256) for family='gqa'"),
    (("llama3-8b", 1, 1024), {"family": "vllm_v1", "dtype": "fp8"},
     "dtype='fp8': must be one of ('float16', 'bfloat16') for family='vllm_v1'"),
    (("llama3-8b", 1, 1024), {"dtype": "float32"}, "dtype='float32': must be one of"),
    (("llama3-8b", 1, 1024), {"prefetch": "bulk"}, "label='bulk': not a PrefetchConfig label"),
    (("llama3-8b", 1, 1024), {"prefetch": 3}, "prefetch=3: must be None, a PrefetchConfig"),
    (("llama3-8b", 1, 1024), {"gpu": "h999"}, "gpu='h999': must be one of"),
    (("llama3-8b", 1, 1024), {"gpu": "a100-80gb-sxm4", "prefetch": "bulk K+V d=1"},
     "prefetch='bulk K+V d=1': cp.async.bulk.prefetch.L2 needs sm_90 or later; "
     "gpu='a100-80gb-sxm4' is sm_80"),
    (("llama3-8b", 1, 1024), {"gpu": "a100-40gb-pcie", "dtype": "fp8"},
     "dtype='fp8': gqa widens e4m3 with cvt.rn.f16x2.e4m3x2, which needs sm_89 or later; "
     "gpu='a100-40gb-pcie' is sm_80"),
    (("llama3-8b", 1, 1024), {"num_sms": 133}, "num_sms=133: must be an integer in [1, 132]"),
    (("llama3-8b", 1, 1024), {"gpu": "h20", "num_sms": 80}, "num_sms=80: must be an integer in "
                                                            "[1, 78]"),
    (("llama3-8b", 1, 1024), {"num_sms": 0}, "num_sms=0: must be an integer in [1, 132]"),
    (("llama3-8b", 1024, 65536), {}, "batch=1024, context=65536: K and V of one layer take "
                                     "274.9 GB, past the NVIDIA H200's 141 GB"),
    (("llama2-7b", 64, 200_000), {"gpu": "h20"}, "batch=64, context=200000: K and V of one "
                                                 "layer take 209.7 GB, past the NVIDIA H20's"),
    (("llama3-8b", 16, None), {}, "context=None: must be an integer"),
    (("llama3-8b", 16, 4096), {"lengths": "lognormal:3200,16384"},
     "context=4096: must be None with lengths='lognormal:3200,16384'"),
    (("llama3-8b", 16, None), {"lengths": "zipf:3,4"},
     "lengths='zipf:3,4': must be 'equal' or a batch of mixed lengths, 'lognormal:MEAN,MAX' "
     "(integers 1 <= MEAN <= MAX) or 'production:MAX' (an integer >= 32)"),
    (("llama3-8b", 16, None), {"lengths": "lognormal:5000,100"}, "lengths='lognormal:5000,100'"),
    (("llama3-8b", 16, None), {"lengths": ["equal"]}, "lengths=['equal']: must be 'equal' or"),
    (("llama3-8b", 65535, None), {"lengths": "lognormal:1000000,2000000", "family": "vllm_v1"},
     "K and V of one layer take"),
])
def test_bad_input_is_refused_by_name(args, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        decode_launch(*args, **kwargs)


def test_a_shape_resolves_as_its_preset_does():
    by_name = launch_point("qwen2.5-7b", 16, 4096)
    by_heads = launch_point((28, 4, 128), 16, 4096)
    assert (by_name.model, by_heads.model) == ("qwen2.5-7b", None)
    for p in (by_name, by_heads):
        assert (p.num_qo_heads, p.num_kv_heads, p.head_dim, p.group) == (28, 4, 128, 7)
        assert p.kv_bytes == 16 * 4096 * 4 * 2 * 128 * 2
        assert p.num_sms == 132 and p.gpu.key == "h200" and p.prefetch == PrefetchConfig()


def test_mixed_lengths_are_drawn_as_the_benchmark_draws_them():
    from kvlab.workload import batch_shape

    p = launch_point("llama3-8b", 64, None, lengths="lognormal:3200,16384")
    lens, mean, tokens, fields = batch_shape(64, "lognormal:3200,16384")
    assert p.lens().tolist() == lens and p.context == fields["max_context"]
    assert p.kv_bytes == tokens * 8 * 2 * 128 * 2
    assert not p.seq_lens.flags.writeable


def test_fp8_halves_the_bytes_and_prefetch_takes_a_label_or_a_config():
    p = launch_point("llama3-8b", 16, 4096, dtype="fp8", prefetch="line K+V d=2")
    assert p.kv_bytes == 16 * 4096 * 8 * 2 * 128
    assert p.prefetch == PrefetchConfig("line", distance=2)
    assert launch_point("llama3-8b", 1, 8, prefetch=PrefetchConfig("bulk")).prefetch.enabled


def test_numpy_integers_are_integers():
    p = launch_point("llama3-8b", np.int64(16), np.int32(4096), block_size=np.int64(32),
                     num_sms=np.int16(80))
    assert (p.batch, p.context, p.block_size, p.num_sms) == (16, 4096, 32, 80)
    assert all(type(v) is int for v in (p.batch, p.context, p.block_size, p.num_sms))
