"""Which backend the lab runs on: "cuda" (every number measured on this GPU) or "sim" (recorded
measurements plus calibrated models, for machines without a GPU).

`KVLAB_BACKEND=cuda|sim` overrides the detection. Detection asks the CUDA driver first (a
millisecond through ctypes): without a driver or a device the answer is "sim" without importing
torch (some 1-2 s). Only where the driver sees a GPU are torch (and CuPy where it is installed)
imported, on first call, to check they can use it. `import kvlab` stays cheap either way.
"""

import ctypes
import ctypes.util
import functools
import importlib.util
import os
import sys

from kvlab.gpus import GPU, detect

BACKENDS = ("cuda", "sim")


def _driver_device_count() -> int:
    """CUDA devices the driver reports (cuInit + cuDeviceGetCount), 0 without a driver."""
    name = "nvcuda.dll" if sys.platform == "win32" else (
        ctypes.util.find_library("cuda") or "libcuda.so.1")
    try:
        driver = ctypes.CDLL(name)
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@functools.cache
def _gpu_name() -> str | None:
    """Name of the first CUDA device usable through torch (and CuPy, if installed), else None."""
    if _driver_device_count() < 1:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() < 1:
                return None
        except Exception:  # CuPy installed for another CUDA version than the driver's
            return None
    return torch.cuda.get_device_name(0)


def backend() -> str:
    """ "cuda" when a GPU is usable, else "sim"; `KVLAB_BACKEND` overrides.

    Raises ValueError for an unknown `KVLAB_BACKEND`, and RuntimeError when it asks for "cuda" on
    a machine where no GPU is usable.
    """
    forced = os.environ.get("KVLAB_BACKEND", "").strip().lower()
    if forced and forced not in BACKENDS:
        raise ValueError(f"KVLAB_BACKEND={forced!r}: must be one of {BACKENDS} (or unset)")
    if forced == "sim":
        return "sim"
    if _gpu_name() is not None:
        return "cuda"
    if forced == "cuda":
        raise RuntimeError(
            "KVLAB_BACKEND='cuda' but no CUDA GPU is usable through torch (and CuPy, if installed)"
        )
    return "sim"


def local_gpu() -> GPU | None:
    """The kvlab.gpus.GPU of the GPU in use (backend "cuda"), or None: without one, or where the
    table does not hold it (kvlab.gpus.detect)."""
    return detect(_gpu_name()) if backend() == "cuda" else None


def device_label() -> str:
    """How the numbers on screen come about: 'measured on <GPU>' or the simulated backend."""
    if backend() == "cuda":
        return f"measured on {_gpu_name()}"
    return "simulated backend: recorded measurements and calibrated models (no GPU in use)"
