"""KernelSpec: the presets' shapes, JSON both ways, and every bad value refused with its name
(CPU)."""

import subprocess
import sys

import numpy as np
import pytest

from kvlab.config import MODELS
from kvlab.profile import KernelSpec


def make_spec(**change) -> KernelSpec:
    fields = dict(kernel="gqa", prefetch="none", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                  batch=4, context=97)
    return KernelSpec(**{**fields, **change})


def test_for_model_takes_the_presets_heads():
    spec = KernelSpec.for_model("qwen2.5-7b", "gqa", "bulk K+V d=1", batch=64, context=4096)
    model = MODELS["qwen2.5-7b"]
    assert (spec.num_qo_heads, spec.num_kv_heads, spec.head_dim) == (
        model.num_qo_heads, model.num_kv_heads, model.head_dim)
    assert (spec.block_size, spec.dtype, spec.num_sms) == (16, "float16", None)
    assert spec.prefetch_config().label() == "bulk K+V d=1"
    assert spec.kv_bytes == 2 * 64 * 4096 * 4 * 128 * 2


def test_json_round_trip_and_plain_ints():
    spec = make_spec(batch=np.int64(3), num_sms=np.int32(78), prefetch="line K d=4 evict_last")
    assert type(spec.batch) is int and type(spec.num_sms) is int
    assert KernelSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kernel": "auto"}, "kernel='auto': must be one of ('vllm_v1', 'gqa')"),
        ({"prefetch": "bulk"}, "prefetch='bulk': must be a PrefetchConfig label"),
        ({"num_kv_heads": 5}, "num_qo_heads=32: must be divisible by num_kv_heads=5"),
        ({"head_dim": 100}, "head_dim=100: must be an integer, one of"),
        ({"batch": 0}, "batch=0: must be an integer >= 1"),
        ({"context": 2.0}, "context=2.0: must be an integer >= 1"),
        ({"block_size": 48}, "block_size=48: must be a power of two in [1, 256]"),
        ({"kernel": "vllm_v1", "block_size": 64},
         "block_size=64: kernel='vllm_v1' supports (8, 16, 32)"),
        ({"num_qo_heads": 72}, "num_qo_heads / num_kv_heads = 9: kernel='gqa' supports groups"),
        ({"dtype": "float32"}, "dtype='float32': must be one of ('float16', 'bfloat16')"),
        ({"num_sms": 0}, "num_sms=0: must be an integer >= 1 or None"),
        ({"num_sms": True}, "num_sms=True: must be an integer >= 1 or None"),
    ],
)
def test_bad_values_are_named(change, message):
    with pytest.raises(ValueError) as err:
        make_spec(**change)
    assert message in str(err.value)


def test_unknown_model_and_bad_json():
    with pytest.raises(ValueError, match="name='gpt-5': must be one of"):
        KernelSpec.for_model("gpt-5", "gqa", batch=1, context=1)
    with pytest.raises(ValueError, match="not JSON"):
        KernelSpec.from_json("{kernel")
    with pytest.raises(ValueError, match="must be a JSON object"):
        KernelSpec.from_json("[1, 2]")
    with pytest.raises(ValueError, match="unexpected keyword argument 'layers'"):
        KernelSpec.from_json(make_spec().to_json()[:-1] + ', "layers": 2}')


def test_import_loads_neither_torch_nor_pandas():
    code = ("import sys, kvlab.profile, kvlab.profile.paper, kvlab.bench.counters; "
            "print([m for m in ('torch', 'pandas') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
