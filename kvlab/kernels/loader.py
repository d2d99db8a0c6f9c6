"""Compiles the CUDA C sources in `kernels/` with CuPy (RawModule / NVRTC), once per instantiation.

The sources ship inside the wheel as `kvlab/csrc/`; in a source checkout they are read from the
top-level `kernels/`. CuPy is imported on first use, so `import kvlab` works without it.

`defined(...)` builds other variants of the same sources: within it, every kernel loaded is
compiled with those macros defined (and cached apart from the plain build), e.g. the timeline
build of `kvlab.kernels.timeline`.
"""

import contextlib
import contextvars
import re
from pathlib import Path

_PACKAGED = Path(__file__).resolve().parents[1] / "csrc"
_CHECKOUT = Path(__file__).resolve().parents[2] / "kernels"
_MACRO = re.compile(r"[A-Z_][A-Z0-9_]*")
_defines: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("defines", default=())


def source_dir() -> Path:
    """The folder holding the `.cu` and `.cuh` files."""
    return _PACKAGED if _PACKAGED.is_dir() else _CHECKOUT


def compile_options() -> tuple[str, ...]:
    return ("-std=c++17", f"-I{source_dir()}", *(f"-D{m}" for m in _defines.get()))


@contextlib.contextmanager
def defined(*macros: str):
    """Within the block, kernels are loaded from a build with these macros defined (names like
    KVLAB_TIMELINE; defined to 1), besides any an enclosing block defines."""
    for m in macros:
        if not isinstance(m, str) or not _MACRO.fullmatch(m):
            raise ValueError(f"macro {m!r}: must be a name of capitals, digits and _")
    token = _defines.set(tuple(sorted({*_defines.get(), *macros})))
    try:
        yield
    finally:
        _defines.reset(token)


def import_cupy():
    try:
        import cupy
    except ImportError as err:
        raise RuntimeError(
            "the CUDA C kernels need CuPy: pip install 'kvlab[gpu]' (cupy-cuda12x), or "
            "cupy-cuda13x for CUDA 13 drivers"
        ) from err
    return cupy


# (filename, device_id, name expression, macros defined) -> (module, kernel)
_kernels: dict[tuple[str, int, str, tuple[str, ...]], tuple] = {}


def load(filename: str, name_expressions, device_id: int = 0) -> tuple:
    """The kernels named by `name_expressions` (C++ template instantiations) in `filename`,
    compiled for GPU `device_id` (with the macros of the enclosing `defined` blocks) and
    cached. Names not yet cached are compiled together in one NVRTC call, so asking for many
    instantiations at once is much faster than one by one. ValueError unless `filename` names
    a file of `source_dir()` (no other folder)."""
    macros = _defines.get()
    names = dict.fromkeys(name_expressions)
    missing = [n for n in names if (filename, device_id, n, macros) not in _kernels]
    if missing:  # NOTE: only a checked filename is ever cached
        if not (isinstance(filename, str) and Path(filename).name == filename
                and (source_dir() / filename).is_file()):
            raise ValueError(f"filename={filename!r}: must be the name of a kernel source in "
                             f"{source_dir()}")
        cupy = import_cupy()
        code = (source_dir() / filename).read_text()
        with cupy.cuda.Device(device_id):
            module = cupy.RawModule(code=code, options=compile_options(), name_expressions=missing)
            for name in missing:
                _kernels[filename, device_id, name, macros] = (module, module.get_function(name))
    return tuple(_kernels[filename, device_id, n, macros][1] for n in name_expressions)


def module_of(filename: str, name_expression: str, device_id: int = 0):
    """The CuPy RawModule that `load` compiled `name_expression` of `filename` into, for GPU
    `device_id`, in the build of the enclosing `defined` blocks: where its globals live (each
    module has its own). KeyError if `load` has not compiled it."""
    return _kernels[filename, device_id, name_expression, _defines.get()][0]
