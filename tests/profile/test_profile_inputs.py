"""Hostile values at kvlab.profile's entry points: ncu's CSV as it should not be, a timeout that
the OS cannot wait for, specs of launches no kernel makes. CPU only."""

import math
import re
import stat

import numpy as np
import pytest

from kvlab.profile import CountersError, KernelSpec, measure
from kvlab.profile.ncu import parse


def make_spec(**change) -> KernelSpec:
    return KernelSpec.for_model("llama2-7b", "gqa", **{"batch": 4, "context": 1024, **change})


def test_a_units_row_shorter_than_its_header_is_ncus_output_not_a_crash():
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"",""\n"0","k","3"\n'
    with pytest.raises(CountersError, match="units row has 2 fields, its header 3") as err:
        parse(text)
    assert err.value.reason == "output"


@pytest.mark.parametrize("timeout_s", [1e300, 1e7, True, np.float64(math.nan)])
def test_a_timeout_the_os_cannot_wait_for_is_refused_before_ncu_runs(tmp_path, timeout_s):
    ran = tmp_path / "ran"
    ncu = tmp_path / "ncu"
    ncu.write_text(f"#!/bin/sh\ntouch {ran}\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match=re.escape(f"timeout_s={timeout_s!r}: must be a finite")):
        measure(make_spec(), timeout_s=timeout_s, ncu=str(ncu))
    assert not ran.exists()


def test_numpy_timeouts_are_numbers(tmp_path):
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\nexit 3\n")
    ncu.chmod(ncu.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(CountersError, match="ncu exited with status 3"):
        measure(make_spec(), timeout_s=np.float32(30.0), ncu=str(ncu))


@pytest.mark.parametrize(("change", "message"), [
    ({"batch": 65536}, "batch=65536, context=1024: num_seqs=65536: the kernels decode at most"),
    ({"context": 2**31}, "context=2147483648: max_seq_len=2147483648: kernel='gqa' runs"),
    ({"context": 2**70}, f"context={2**70}: max_seq_len={2**70}: kernel='gqa' runs"),
])
def test_a_spec_of_a_launch_no_kernel_makes_is_refused(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_spec(**change)


def test_vllm_v1_specs_are_held_to_its_partitions():
    with pytest.raises(ValueError, match="kernel='vllm_v1' runs sequences of 1 to 33553920"):
        KernelSpec.for_model("llama2-7b", "vllm_v1", batch=1, context=33553921)
