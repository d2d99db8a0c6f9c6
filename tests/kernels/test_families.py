"""kvlab.kernels.families is the one table of kernel families: every place that needs a family's
layout, block sizes, groups or dtypes reads it, so they all agree. CPU only."""

import re
import subprocess
import sys

import pytest

from kvlab.kernels import FAMILIES, KERNEL_FAMILIES, KERNELS
from kvlab.kernels.families import BLOCK_SIZES, family_for_layout, kernel_layout
from kvlab.kernels.loader import source_dir
from kvlab.predict.point import launch_point
from kvlab.profile.spec import KernelSpec
from kvlab.sim.spec import TraceSpec


def test_families_are_the_table_s_names():
    assert FAMILIES == tuple(KERNEL_FAMILIES) == ("vllm_v1", "gqa")
    assert KERNELS == ("auto", *FAMILIES)
    for name, family in KERNEL_FAMILIES.items():
        assert family.name == name
        assert (source_dir() / family.source).is_file()
    assert BLOCK_SIZES == tuple(sorted({s for f in KERNEL_FAMILIES.values()
                                        for s in f.block_sizes}))


def test_importing_the_table_loads_no_torch():
    code = "import sys, kvlab.kernels.families; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", FAMILIES)
def test_each_launcher_module_reads_its_row(name):
    family = KERNEL_FAMILIES[name]
    module = family.module
    assert module.FAMILY is family and module.SOURCE == family.source
    assert family.launcher_class().__module__ == module.__name__
    # what CI compiles covers every block size of the row
    instances = " ".join(module.default_instances())
    for block_size in family.block_sizes:
        assert re.search(rf"_decode<__half, (__half, )?128, {block_size},", instances), block_size


def test_the_cache_layouts_come_from_the_table():
    from kvlab.engine.runner import cache_layout

    for name, family in KERNEL_FAMILIES.items():
        assert kernel_layout(name) == cache_layout(name) == family.layout
        assert family_for_layout(family.layout) == name
    assert cache_layout("auto") == kernel_layout("auto")
    with pytest.raises(ValueError, match=r"kernel='flash': must be one of"):
        kernel_layout("flash")


@pytest.mark.parametrize("name", FAMILIES)
def test_the_checks_take_exactly_the_table_s_block_sizes(name):
    family = KERNEL_FAMILIES[name]
    spec = dict(kernel=name, prefetch="none", num_qo_heads=32, num_kv_heads=8, head_dim=128,
                batch=1, context=1024, dtype="float16")
    trace = dict(family=name, num_seqs=1, context=64, num_qo_heads=8, num_kv_heads=2,
                 partition_size=0, ctas_per_sm=1)
    for block_size in (1, 4, *BLOCK_SIZES, 512):
        takes = block_size in family.block_sizes
        for check in (lambda b=block_size: KernelSpec(**spec, block_size=b),
                      lambda b=block_size: TraceSpec(**trace, block_size=b),
                      lambda b=block_size: launch_point("llama3-8b", 1, 1024, block_size=b,
                                                        family=name)):
            if takes:
                check()
            else:
                with pytest.raises(ValueError, match=f"block_size={block_size}"):
                    check()


def test_the_group_limits_come_from_the_table():
    gqa = KERNEL_FAMILIES["gqa"]
    fields = dict(kernel="gqa", prefetch="none", num_kv_heads=1, head_dim=128, batch=1,
                  context=1024, dtype="float16", block_size=16)
    KernelSpec(**fields, num_qo_heads=gqa.max_group)
    with pytest.raises(ValueError, match=f"supports groups 1 to {gqa.max_group}"):
        KernelSpec(**fields, num_qo_heads=gqa.max_group + 1)
    assert KERNEL_FAMILIES["vllm_v1"].max_group is None
    KernelSpec(**{**fields, "kernel": "vllm_v1"}, num_qo_heads=2 * gqa.max_group)


def test_the_panels_offer_the_table_s_block_sizes(monkeypatch):
    monkeypatch.setenv("KVLAB_BACKEND", "sim")
    from kvlab.panels.decode_kernels import DecodeKernelsTab
    from kvlab.panels.l2 import L2Tab

    for tab in (DecodeKernelsTab(), L2Tab(batch=2, context=1024)):
        assert tuple(tab.controls["block_size"].options) == BLOCK_SIZES
    assert tuple(DecodeKernelsTab().controls["kernel"].options) == FAMILIES
