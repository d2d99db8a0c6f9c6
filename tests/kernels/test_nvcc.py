"""Every .cu file compiles with nvcc for sm_90, and the default instantiations neither spill nor
keep arrays in local memory (a stack frame: vllm_v1's K vectors once did, at blocks 8 and 32
and at head_dim 256).

Runs on the CPU (nvcc needs no GPU); skipped where nvcc is not installed.
"""

import re
import shutil
import subprocess

import pytest
import torch

from kvlab.checks import HEAD_DIMS
from kvlab.kernels import gqa, layer_ops, read, timeline, vllm_v1
from kvlab.kernels.geometry import ctas_per_sm, gqa_smem_bytes, gqa_stages
from kvlab.kernels.loader import compile_options, source_dir
from kvlab.kernels.prefetch import PrefetchConfig

NVCC = shutil.which("nvcc")
pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(NVCC is None, reason="nvcc not found")]
FAMILIES = {family.SOURCE: family for family in (vllm_v1, gqa, layer_ops)}
SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
STACK = re.compile(r"(\d+) bytes stack frame")


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
def test_family_compiles_without_spills_or_stack(filename, tmp_path):
    family = FAMILIES[filename]
    lines = [f'#include "{filename}"', "void kvlab_instantiate() {"]
    lines += [f"  (void)&{name};" for name in family.default_instances()]
    unit = tmp_path / "instances.cu"
    unit.write_text("\n".join([*lines, "}", ""]))
    report = nvcc(unit, tmp_path)
    spills = [m.group(0) for m in SPILL.finditer(report) if m.group(0).split()[0] != "0"
              or m.group(2) != "0"]
    assert not spills, f"{len(spills)} kernels spill: {spills[:5]}"
    stacks = [m.group(0) for m in STACK.finditer(report) if m.group(1) != "0"]
    assert not stacks, f"{len(stacks)} kernels keep a stack frame: {stacks[:5]}"
    assert len(re.findall(r"Compiling entry function", report)) >= len(family.default_instances())


@pytest.mark.parametrize(
    "filename", sorted(p.name for p in source_dir().glob("*.cu") if p.name not in FAMILIES)
)
def test_every_other_cu_file_compiles(filename, tmp_path):
    nvcc(source_dir() / filename, tmp_path, "-rdc=true")


def test_gqa_shared_memory_is_what_the_launcher_reserves(tmp_path):
    """The kernel's own Smem geometry (stages, dynamic shared memory, CTAs an SM) equals the
    Python side's (kvlab.kernels.geometry), which sizes each launch: checked by static_assert
    in a unit nvcc compiles, for every head_dim, both element sizes and CTAs of 4 warps, and
    of 8 where those fit an SM (not at head_dim 256)."""
    lines = [f'#include "{gqa.SOURCE}"']
    for head_dim in HEAD_DIMS:
        for kv_bytes in (1, 2):
            for warps in (4, 8):
                if ctas_per_sm(head_dim, kv_bytes, warps) == 0:
                    assert warps == 8 and head_dim == 256
                    continue
                smem = f"kvlab::gqa::Smem<{head_dim}, {kv_bytes}, {warps}>"
                for field, value in (("STAGES", gqa_stages(kv_bytes)),
                                     ("BYTES", gqa_smem_bytes(head_dim, kv_bytes, warps)),
                                     ("CTAS_PER_SM", ctas_per_sm(head_dim, kv_bytes, warps))):
                    lines.append(f'static_assert({smem}::{field} == {value}, "{smem}::{field}");')
    unit = tmp_path / "smem.cu"
    unit.write_text("\n".join([*lines, ""]))
    nvcc(unit, tmp_path)


# Checks Smem<D, B, W>::at over one warp tile: each row's chunks fill the row (a permutation, none
# past it); the two chunks of every 32-byte sector land in one 32-byte sector; and, for each
# chunk, the 8 rows an ldmatrix phase reads (rows 0-7 or 8-15) fall in at most WAYS of the same
# 16-byte bank group (8 groups make a 128-byte bank line).
LAYOUT_CHECK = """
template <class S> constexpr bool layout_ok(int ways) {
  constexpr int CHUNKS = S::MIN_ROW_BYTES / 16;
  for (int r = 0; r < 16; ++r) {
    bool used[64] = {};
    for (int c = 0; c < CHUNKS; ++c) {
      const int at = S::at(r, c) - r * S::ROW_BYTES;
      if (at < 0 || at % 16 != 0 || at >= S::ROW_BYTES || used[at / 16]) return false;
      used[at / 16] = true;
      if (c % 2 == 1 && S::at(r, c) / 32 != S::at(r, c - 1) / 32) return false;
    }
  }
  for (int r0 = 0; r0 < 16; r0 += 8)
    for (int c = 0; c < CHUNKS; ++c) {
      int count[8] = {};
      for (int i = 0; i < 8; ++i)
        if (++count[(S::at(r0 + i, c) / 16) % 8] > ways) return false;
    }
  return true;
}
"""


def test_gqa_shared_memory_layout_serves_sectors_whole_without_bank_conflicts(tmp_path):
    """gqa_decode's shared-memory rows: every 32-byte cache sector lands in one 32-byte shared
    sector (else L2 serves it twice, the kernel's v7), and an ldmatrix phase meets no bank
    conflict where the rows are swizzled (16-bit rows of whole 128-byte lines) and at most a
    2-way one where they are padded; the row holds what the kernel reads (fp8 at head_dim 80
    and 112: 16 bytes past the data). Checked by static_assert under nvcc, for every head_dim
    and element size."""
    lines = [f'#include "{gqa.SOURCE}"', LAYOUT_CHECK]
    for head_dim in HEAD_DIMS:
        for kv_bytes in (1, 2):
            smem = f"kvlab::gqa::Smem<{head_dim}, {kv_bytes}, 4>"
            need = head_dim * kv_bytes + (16 if kv_bytes == 1 and head_dim in (80, 112) else 0)
            swizzle = kv_bytes == 2 and need % 128 == 0
            lines += [f'static_assert({smem}::MIN_ROW_BYTES == {need}, "{smem} row");',
                      f'static_assert(layout_ok<{smem}>({smem}::SWIZZLE ? 1 : 2), "{smem}");',
                      f'static_assert({smem}::SWIZZLE == {str(swizzle).lower()}, "{smem}");']
    unit = tmp_path / "layout.cu"
    unit.write_text("\n".join([*lines, ""]))
    nvcc(unit, tmp_path)


def test_the_timeline_layout_is_the_one_python_reads(tmp_path):
    """kernels/timeline.cuh's array and each kernel's region and slots are those
    kvlab.kernels.timeline reads: checked by static_assert under nvcc."""
    ns = "kvlab::timeline"
    lines = ['#include "timeline.cuh"']
    lines += [f'static_assert({ns}::{field} == {value}, "{field}");' for field, value in
              (("REGIONS", timeline.REGIONS), ("MAX_CTAS", timeline.MAX_CTAS),
               ("SLOTS", timeline.SLOTS), ("SM", timeline.SM_SLOT))]
    for kernel, (region, stamps) in timeline.KERNELS.items():
        lines.append(f'static_assert({ns}::{kernel}::REGION == {region}, "{kernel}");')
        lines += [f'static_assert({ns}::{kernel}::{stamp.upper()} == {slot}, "{kernel} {stamp}");'
                  for slot, stamp in enumerate(stamps, start=1)]
    unit = tmp_path / "timeline.cu"
    unit.write_text("\n".join([*lines, ""]))
    nvcc(unit, tmp_path)


def test_the_timeline_build_compiles_without_spills(tmp_path):
    """What `bench timeline` runs: gqa (the paper's four models' groups, CTAs of 4 and 8 warps)
    and the read, with KVLAB_TIMELINE defined."""
    names = [n for group in (1, 4, 5, 7) for warps in (4, 8)
             for n in gqa.name_expressions(torch.float16, 128, 16, group, PrefetchConfig(),
                                           warps=warps)]
    lines = [f'#include "{gqa.SOURCE}"', f'#include "{read.SOURCE}"',
             "void kvlab_instantiate() {", *(f"  (void)&{n};" for n in dict.fromkeys(names)), "}"]
    unit = tmp_path / "traced.cu"
    unit.write_text("\n".join([*lines, ""]))
    report = nvcc(unit, tmp_path, "-DKVLAB_TIMELINE")
    assert not [m.group(0) for m in SPILL.finditer(report) if m.group(0).split()[0] != "0"
                or m.group(2) != "0"]
    assert len(re.findall(r"Compiling entry function", report)) == len(set(names)) + 1
