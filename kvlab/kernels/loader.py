"""Compiles the CUDA C sources in `kernels/` with CuPy (RawModule / NVRTC), once per instantiation.

The sources ship inside the wheel as `kvlab/csrc/`; in a source checkout they are read from the
top-level `kernels/`. CuPy is imported on first use, so `import kvlab` works without it.
"""

from pathlib import Path

_PACKAGED = Path(__file__).resolve().parents[1] / "csrc"
_CHECKOUT = Path(__file__).resolve().parents[2] / "kernels"


def source_dir() -> Path:
    """The folder holding the `.cu` and `.cuh` files."""
    return _PACKAGED if _PACKAGED.is_dir() else _CHECKOUT


def compile_options() -> tuple[str, ...]:
    return ("-std=c++17", f"-I{source_dir()}")


def import_cupy():
    try:
        import cupy
    except ImportError as err:
        raise RuntimeError(
            "the CUDA C kernels need CuPy: pip install 'kvlab[gpu]' (cupy-cuda12x), or "
            "cupy-cuda13x for CUDA 13 drivers"
        ) from err
    return cupy


_kernels: dict[tuple[str, int, str], object] = {}


def load(filename: str, name_expressions, device_id: int = 0) -> tuple:
    """The kernels named by `name_expressions` (C++ template instantiations) in `filename`,
    compiled for GPU `device_id` and cached. Names not yet cached are compiled together in one
    NVRTC call, so asking for many instantiations at once is much faster than one by one."""
    names = dict.fromkeys(name_expressions)
    missing = [n for n in names if (filename, device_id, n) not in _kernels]
    if missing:
        cupy = import_cupy()
        code = (source_dir() / filename).read_text()
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(code=code, options=compile_options(), name_expressions=missing)
            for name in missing:
                _kernels[filename, device_id, name] = module.get_function(name)
    return tuple(_kernels[filename, device_id, n] for n in name_expressions)
