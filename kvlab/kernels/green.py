"""Decode on fewer SMs than the GPU has: CUDA green contexts (`torch.cuda.green_contexts`).

The L2-prefetch paper measured on an H20 with 78 SMs; the H200 has 132. `sm_limit(num_sms)` runs
the work enqueued inside it on the stream of a green context that holds part of the SMs, so the
same kernels can be timed on fewer SMs. The driver hands SMs out in groups, so a context may hold
more than asked: `sm_limit` counts the SMs its CTAs really land on (kernels/sm_ids.cu) and yields
that count. Plans made inside the block see it (`current_sms`), so the kernels' split policies
fill the SMs they have.

NOTE: only the launches on the context's stream are limited (torch's current stream inside the
block); work on other streams still runs on every SM.
"""

import contextlib
import functools

import numpy as np
import torch

from kvlab.checks import is_int

SPIN_CYCLES = 20_000  # ~10 us at H200 clocks: long enough for one launch to reach every SM
CTAS_PER_SM = 16  # CTAs of the counting launch per SM of the whole GPU

_limits: list[int] = []  # the SM counts of the sm_limit blocks entered, innermost last


def device_sms(device=None) -> int:
    """The SMs of the whole GPU."""
    return torch.cuda.get_device_properties(_device(device)).multi_processor_count


def current_sms(device=None) -> int:
    """The SMs that work enqueued now may use: the innermost `sm_limit`'s, else the GPU's."""
    return _limits[-1] if _limits else device_sms(device)


def unavailable_reason() -> str | None:
    """Why green contexts cannot limit the SMs here, or None when they can."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        from torch.cuda import green_contexts
    except ImportError:
        return f"torch {torch.__version__} has no torch.cuda.green_contexts"
    if not getattr(green_contexts, "SUPPORTED", True):
        return f"torch {torch.__version__} was built without green context support"
    return None


def sms_in_use(device=None) -> int:
    """How many distinct SMs one launch on torch's current stream lands on."""
    from kvlab.kernels.launch import launch
    from kvlab.kernels.loader import load

    device = _device(device)
    (kernel,) = load("sm_ids.cu", ["record_sm_ids"], device.index)
    ids = torch.full((CTAS_PER_SM * device_sms(device),), -1, dtype=torch.int32, device=device)
    launch(kernel, (ids.numel(),), (32,), (np.uint64(ids.data_ptr()), np.int64(SPIN_CYCLES)),
           device)
    return int(torch.unique(ids).numel())


@contextlib.contextmanager
def sm_limit(num_sms: int | None, device=None):
    """Run the work enqueued inside the block on `num_sms` SMs (or the few more the driver
    rounds up to); yields the count measured. None, or the GPU's own count: the whole GPU, no
    green context. Raises ValueError for a count outside [1, the GPU's SMs], and RuntimeError
    when green contexts are not available here (`unavailable_reason`)."""
    device = _device(device)
    total = device_sms(device)
    if num_sms is not None and (not is_int(num_sms) or not 1 <= num_sms <= total):
        raise ValueError(f"num_sms={num_sms!r}: must be an integer in [1, {total}] (this GPU's "
                         "SMs) or None")
    if num_sms is None or num_sms == total:
        _limits.append(total)
        try:
            yield total
        finally:
            _limits.pop()
        return
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"num_sms={num_sms}: green contexts are not available ({reason})")
    _, stream, held = _green_context(num_sms, device.index)
    with torch.cuda.stream(stream):
        _limits.append(held)
        try:
            yield held
        finally:
            _limits.pop()


@functools.cache
def _green_context(num_sms: int, device_index: int) -> tuple[object, torch.cuda.Stream, int]:
    """A green context of `num_sms` SMs, made once per process and never freed: the context (the
    cache holds it, since its streams die with it), its stream, and the SMs a launch on it
    reaches."""
    from torch.cuda.green_contexts import GreenContext

    context = GreenContext.create(num_sms=num_sms, device_id=device_index)
    stream = context.Stream()
    with torch.cuda.stream(stream):
        held = sms_in_use(torch.device("cuda", device_index))
    stream.synchronize()
    return context, stream, held


def _device(device) -> torch.device:
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else (
        torch.device(device))
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
