"""Launching CuPy kernels on torch tensors: raw pointers and torch's current stream, no copies."""

import ctypes
import functools

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


@functools.cache
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def resident_ctas(kernel, num_threads: int, shared_mem: int, device: torch.device) -> int:
    """How many CTAs of `kernel` (num_threads each, shared_mem bytes of dynamic shared memory)
    one SM of `device` holds at once, as the driver computes it (registers, shared memory,
    threads).

    NOTE: asked of libcuda directly: cuda.bindings' first call resolves its entry points through
    cuGetProcAddress, whose failed probes compute-sanitizer reports as API errors."""
    count = ctypes.c_int()
    with import_cupy().cuda.Device(device.index):
        err = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(count), ctypes.c_void_p(kernel.kernel.ptr), ctypes.c_int(num_threads),
            ctypes.c_size_t(shared_mem))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: CUresult {err}")
    return count.value


def launch(kernel, grid, block, args, device: torch.device, shared_mem: int = 0) -> None:
    with import_cupy().cuda.Device(device.index), torch_stream(device):
        kernel(grid, block, args, shared_mem=shared_mem)


# kernel argument types as CUDA's driver takes them (launch passes numpy scalars to CuPy)
_C_TYPES = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
            np.dtype(np.int32): ctypes.c_int32, np.dtype(np.float32): ctypes.c_float}


@functools.cache
def _dependent_launch_supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def launch_dependent(kernel, grid, block, args, device: torch.device,
                     shared_mem: int = 0) -> None:
    """Launch `kernel` as a programmatic dependent launch (Hopper and later): the GPU may start
    it while the kernel before it in the stream still runs, once every CTA of that kernel has
    executed `griddepcontrol.launch_dependents` (or exited). The kernel must execute
    `griddepcontrol.wait` before it reads what the previous kernel writes: the wait returns when
    that kernel has completed and its memory is visible. This hides the launch gap between a
    kernel and a short one that consumes its output. Before sm_90 it is an ordinary launch (and
    both instructions are compiled out there)."""
    if not _dependent_launch_supported(device.index):
        launch(kernel, grid, block, args, device, shared_mem)
        return
    from cuda.bindings import driver  # a dependency of numba-cuda

    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = (*grid, 1, 1)[:3]
    config.blockDimX, config.blockDimY, config.blockDimZ = (*block, 1, 1)[:3]
    config.sharedMemBytes = shared_mem
    config.hStream = driver.CUstream(torch.cuda.current_stream(device).cuda_stream)
    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config.attrs, config.numAttrs = [attribute], 1
    params = (tuple(a.item() for a in args), tuple(_C_TYPES[a.dtype] for a in args))
    with import_cupy().cuda.Device(device.index):
        function = driver.CUfunction(kernel.kernel.ptr)
        (err,) = driver.cuLaunchKernelEx(config, function, params, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernelEx: {err.name}")
