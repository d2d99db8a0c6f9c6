"""Launching CuPy kernels on torch tensors: raw pointers and torch's current stream, no copies."""

import numpy as np
import torch

from kvlab.kernels.loader import import_cupy

NULL = np.uint64(0)


def ptr(t: torch.Tensor | None) -> np.uint64:
    """A kernel argument for a device pointer (CuPy passes a uint64 scalar by value)."""
    return NULL if t is None else np.uint64(t.data_ptr())


_streams: dict[int, object] = {}


def torch_stream(device: torch.device):
    """CuPy's view of torch's current stream on `device` (so launches order with torch work)."""
    current = torch.cuda.current_stream(device)
    stream = _streams.get(current.cuda_stream)
    if stream is None:  # torch streams speak the CUDA stream protocol (__cuda_stream__)
        stream = _streams[current.cuda_stream] = import_cupy().cuda.Stream.from_external(current)
    return stream


def reserve_shared_memory(kernel, num_bytes: int) -> None:
    """Let `kernel` launch with up to `num_bytes` of dynamic shared memory.

    NOTE: the limit belongs to the compiled kernel, which every plan of its instantiation shares:
    it only ever grows, so that a plan made for shorter sequences cannot shrink it under one made
    earlier for longer ones (their launches would fail with an invalid argument)."""
    if num_bytes > kernel.max_dynamic_shared_size_bytes:
        kernel.max_dynamic_shared_size_bytes = num_bytes


def launch(kernel, grid, block, args, device: torch.device, shared_mem: int = 0) -> None:
    with import_cupy().cuda.Device(device.index), torch_stream(device):
        kernel(grid, block, args, shared_mem=shared_mem)
