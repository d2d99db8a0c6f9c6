"""A tab's arguments (the starting values of its controls): one its control does not offer is a
ValueError naming the parameter, not a value clamped into range or a TraitError; numpy scalars
are taken (CPU, "sim" backend)."""

import math
import re

import numpy as np
import pytest

from kvlab.panels.decode_kernels import DecodeKernelsTab
from kvlab.panels.kvpr import KVPRTab
from kvlab.panels.l2 import L2Tab
from kvlab.panels.paged_cache import PagedCacheTab

NOT_IN_RANGE = [0, -1, math.nan, math.inf, 2**70, True, 1.5]
CASES = [
    (DecodeKernelsTab, "batch", NOT_IN_RANGE, "must be an integer in [1, 1024]"),
    (DecodeKernelsTab, "context", NOT_IN_RANGE, "must be an integer in [1, 131072]"),
    (DecodeKernelsTab, "distance", NOT_IN_RANGE, "must be an integer in [1, 16]"),
    (DecodeKernelsTab, "block_size", [0, 48, 2**70, True, math.nan],
     "must be one of [8, 16, 32, 64, 128, 256]"),
    (DecodeKernelsTab, "model", ["gpt-5", None], "must be one of ['llama2-7b'"),
    (DecodeKernelsTab, "gpu", ["h999", 3], "must be one of ['h200', 'h100-sxm'"),
    (DecodeKernelsTab, "heads", [(32, 4, 128)], "llama3-8b's are (32, 8, 128); pass "
                                                "model='custom'"),
    (DecodeKernelsTab, "heads", [(32, 8)], "must be (num_qo_heads, num_kv_heads, head_dim)"),
    (DecodeKernelsTab, "kv_dtype", ["fp4"], "must be one of ['float16', 'fp8']"),
    (KVPRTab, "batch", NOT_IN_RANGE, "must be an integer in [1, 1024]"),
    (KVPRTab, "context", NOT_IN_RANGE, "must be an integer in [1, 32768]"),
    (L2Tab, "num_sms", [7, 133, math.nan, True, 2**70], "must be an integer in [8, 132]"),
    (L2Tab, "distance", [0, 3, True, math.nan], "must be one of [1, 2, 4, 8]"),
    (L2Tab, "kernel", ["sdpa"], "must be one of ['vllm_v1', 'gqa']"),
    (PagedCacheTab, "num_requests", NOT_IN_RANGE, "must be an integer in [1, 1000]"),
    (PagedCacheTab, "prefix_len", [-1, 4097, math.nan, 2**70, True], "must be an integer in [0,"),
    (PagedCacheTab, "shared_fraction", [-0.1, 1.5, math.nan, math.inf, True],
     "must be a finite number >= 0.0 and <= 1.0"),
    (PagedCacheTab, "budget_gib", [0, 0.25, 161, math.nan, math.inf, True],
     "must be a finite number >= 0.5 and <= 160.0"),
    (PagedCacheTab, "block_size", [0, 3, 512, True], "must be one of [1, 2, 4"),
    (PagedCacheTab, "num_table_requests", [0, -1, math.nan, True], "must be an integer >= 1"),
    (PagedCacheTab, "seed", [-1, math.nan, True, 1.5], "must be an integer >= 0"),
]


@pytest.mark.parametrize("tab,name,value,allowed", [
    pytest.param(tab, name, value, allowed, id=f"{tab.__name__}-{name}={value!r}")
    for tab, name, values, allowed in CASES for value in values])
def test_an_argument_its_control_does_not_offer_is_refused_naming_it(monkeypatch, tab, name,
                                                                     value, allowed):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}: {allowed}")):
        tab(**{name: value})


@pytest.mark.parametrize("tab,name,value,control", [
    (DecodeKernelsTab, "batch", np.int64(32), "batch"),
    (DecodeKernelsTab, "block_size", np.int32(32), "block_size"),
    (KVPRTab, "context", np.uint16(2048), "context"),
    (L2Tab, "num_sms", np.int64(64), "sms"),
    (L2Tab, "distance", np.int64(4), "distance"),
    (PagedCacheTab, "budget_gib", np.float32(8.0), "budget_gib"),
    (PagedCacheTab, "num_requests", np.int16(100), "num_requests"),
])
def test_numpy_arguments_are_taken(monkeypatch, tab, name, value, control):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    assert tab(**{name: value}).controls[control].value == value
