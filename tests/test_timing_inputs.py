"""The timer's counts and sizes are checked before anything is allocated or called (CPU)."""

import math
import re

import pytest

from kvlab.timing import Timer, back_to_back_ms, copy_roofline_gbps


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_runs": 2.5}, "num_runs=2.5"), ({"num_runs": math.nan}, "num_runs=nan"),
    ({"num_runs": True}, "num_runs=True"), ({"num_runs": "3"}, "num_runs='3'"),
    ({"num_warmup": -1}, "num_warmup=-1"), ({"num_warmup": 0.5}, "num_warmup=0.5"),
    ({"flush_l2": "no"}, "flush_l2='no'"),
])
def test_timer_counts_are_checked_before_anything_is_allocated(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Timer("cpu", **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_calls": 2.5}, "num_calls=2.5"), ({"num_calls": math.nan}, "num_calls=nan"),
    ({"num_warmup": True}, "num_warmup=True"),
])
def test_back_to_back_counts_are_checked_before_any_call(kwargs, message):
    calls = []
    with pytest.raises(ValueError, match=re.escape(message)):
        back_to_back_ms(lambda: calls.append(1), "cpu", **kwargs)
    assert calls == []


@pytest.mark.parametrize("num_bytes", [0, 1, True, 2.5e9])
def test_copy_roofline_needs_bytes_to_copy(num_bytes):
    with pytest.raises(ValueError, match=re.escape(f"num_bytes={num_bytes!r}: must be an integer")):
        copy_roofline_gbps(Timer("cpu", flush_l2=False), num_bytes)
