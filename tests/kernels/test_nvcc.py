"""Every .cu file compiles with nvcc for sm_90, and the default instantiations do not spill.

Runs on the CPU (nvcc needs no GPU); skipped where nvcc is not installed.
"""

import re
import shutil
import subprocess

import pytest

from kvlab.checks import HEAD_DIMS
from kvlab.kernels import gqa, layer_ops, vllm_v1
from kvlab.kernels.geometry import ctas_per_sm, gqa_smem_bytes, gqa_stages
from kvlab.kernels.loader import compile_options, source_dir

NVCC = shutil.which("nvcc")
pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(NVCC is None, reason="nvcc not found")]
FAMILIES = {family.SOURCE: family for family in (vllm_v1, gqa, layer_ops)}
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def nvcc(source, tmp_path, *extra):
    out = subprocess.run(
        [NVCC, "-arch=sm_90", *compile_options(), "-Xptxas", "-v", *extra, "-c", str(source),
         "-o", str(tmp_path / "out.o")],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr


def test_every_cu_file_is_known():
    files = {p.name for p in source_dir().glob("*.cu")}
    assert set(FAMILIES) <= files


@pytest.mark.parametrize("filename", sorted(FAMILIES))
def test_family_compiles_without_spills(filename, tmp_path):
    family = FAMILIES[filename]
    lines = [f'#include "{filename}"', "void kvlab_instantiate() {"]
    lines += [f"  (void)&{name};" for name in family.default_instances()]
    unit = tmp_path / "instances.cu"
    unit.write_text("\n".join([*lines, "}", ""]))
    report = nvcc(unit, tmp_path)
    spills = [m.group(0) for m in SPILL.finditer(report) if m.group(0).split()[0] != "0"
              or m.group(2) != "0"]
    assert not spills, f"{len(spills)} kernels spill: {spills[:5]}"
    assert len(re.findall(r"Compiling entry function", report)) >= len(family.default_instances())


@pytest.mark.parametrize(
    "filename", sorted(p.name for p in source_dir().glob("*.cu") if p.name not in FAMILIES)
)
def test_every_other_cu_file_compiles(filename, tmp_path):
    nvcc(source_dir() / filename, tmp_path, "-rdc=true")


def test_gqa_shared_memory_is_what_the_launcher_reserves(tmp_path):
    """The kernel's own Smem geometry (stages, dynamic shared memory, CTAs an SM) equals the
    Python side's (kvlab.kernels.geometry), which sizes each launch: checked by static_assert
    in a unit nvcc compiles, for every head_dim and both element sizes."""
    lines = [f'#include "{gqa.SOURCE}"']
    for head_dim in HEAD_DIMS:
        for kv_bytes in (1, 2):
            smem = f"kvlab::gqa::Smem<{head_dim}, {kv_bytes}>"
            for field, value in (("STAGES", gqa_stages(kv_bytes)),
                                 ("BYTES", gqa_smem_bytes(head_dim, kv_bytes)),
                                 ("CTAS_PER_SM", ctas_per_sm(head_dim, kv_bytes))):
                lines.append(f'static_assert({smem}::{field} == {value}, "{smem}::{field}");')
    unit = tmp_path / "smem.cu"
    unit.write_text("\n".join([*lines, ""]))
    nvcc(unit, tmp_path)
