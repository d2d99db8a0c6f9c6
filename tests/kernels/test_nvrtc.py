"""The CUDA C families compile under NVRTC, the compiler CuPy uses at run time (it lacks the host
C++ headers that nvcc has, e.g. <cstdint>). Runs on the CPU; skipped without libnvrtc."""

import os
import shutil
from pathlib import Path

import pytest

from kvlab.kernels import gqa, layer_ops, vllm_v1
from kvlab.kernels.loader import compile_options, source_dir

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")


def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's headers (cuda_fp16.h, ...), which CuPy also hands to NVRTC."""
    nvcc = shutil.which("nvcc")
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda",
             nvcc and Path(nvcc).resolve().parents[1]]
    for root in filter(None, roots):
        if (Path(root) / "include" / "cuda_fp16.h").is_file():
            return Path(root) / "include"
    return None


def _nvrtc_loads() -> bool:
    try:
        return nvrtc.nvrtcVersion()[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    except Exception:  # libnvrtc not installed
        return False


pytestmark = [
    pytest.mark.compile,
    pytest.mark.skipif(cuda_include_dir() is None or not _nvrtc_loads(),
                       reason="needs libnvrtc and the CUDA headers"),
]


def compile_log(source: str, names: list[str]) -> tuple[bool, str]:
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    for name in names:
        nvrtc.nvrtcAddNameExpression(prog, name.encode())
    options = [o.encode() for o in (*compile_options(), "-arch=sm_90", f"-I{cuda_include_dir()}")]
    result = nvrtc.nvrtcCompileProgram(prog, len(options), options)[0]
    size = nvrtc.nvrtcGetProgramLogSize(prog)[1]
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(prog)
    return result == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode(errors="replace")


@pytest.mark.parametrize("family", [vllm_v1, gqa, layer_ops], ids=lambda f: f.SOURCE)
def test_family_compiles_under_nvrtc(family):
    ok, log = compile_log((source_dir() / family.SOURCE).read_text(), family.default_instances())
    assert ok, log[-4000:]


def test_sm_ids_compiles_under_nvrtc():
    ok, log = compile_log((source_dir() / "sm_ids.cu").read_text(), ["record_sm_ids"])
    assert ok, log[-4000:]
