"""Green contexts: SM counts checked, plans seeing the SMs of their block, a bandwidth-bound
kernel slower on 32 SMs than on the whole GPU (GPU)."""

import pytest
import torch

from kvlab.kernels import green

pytestmark = pytest.mark.gpu


def copy_ms(num_bytes: int = 2**30) -> float:
    """One device-to-device copy of `num_bytes` on torch's current stream, warm, in ms."""
    src = torch.empty(num_bytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 5


@pytest.mark.skipif(green.unavailable_reason() is not None, reason="no green contexts here")
def test_32_sms_hold_32_or_a_few_more_and_copy_slower():
    total = green.device_sms()
    whole = copy_ms()
    with green.sm_limit(32) as held:
        assert 32 <= held < total
        assert green.current_sms() == held == green.sms_in_use()
        limited = copy_ms()
    assert green.current_sms() == total
    # Fewer SMs cannot keep as many loads in flight: the copy slows by how much depends on the
    # GPU's bandwidth per SM (1.46x at 32 SMs on an H100, more on an H200); unlimited, it would not
    assert limited > 1.2 * whole, (limited, whole)


def test_the_whole_gpu_needs_no_green_context():
    total = green.device_sms()
    with green.sm_limit(None) as held:
        assert held == total == green.current_sms()
    assert green.sms_in_use() == total


@pytest.mark.parametrize("num_sms", [0, -1, 10_000, 32.0, True])
def test_bad_sm_counts_are_refused(num_sms):
    with pytest.raises(ValueError, match=rf"num_sms={num_sms!r}: must be an integer in \[1, "):
        with green.sm_limit(num_sms):
            pass
    assert green.current_sms() == green.device_sms()


@pytest.mark.skipif(green.unavailable_reason() is not None, reason="no green contexts here")
def test_a_plan_made_inside_sees_the_sms_it_has():
    from kvlab.cache import filled_cache
    from kvlab.kernels.decode import DecodePlan

    cache, seq_ids, _ = filled_cache(2, 1024, 16, 8, 128, layout="hnd", dtype=torch.float16)
    assert DecodePlan(cache, seq_ids, 32, "gqa").num_sms == green.device_sms()
    with green.sm_limit(32) as held:
        assert DecodePlan(cache, seq_ids, 32, "gqa").num_sms == held
    with pytest.raises(ValueError, match="num_sms=0: must be an integer >= 1"):
        DecodePlan(cache, seq_ids, 32, "gqa", num_sms=0)
