"""The GPU table: every entry valid and sourced, detection from driver names, and the labels that
say which model inputs were measured and which are assumed (CPU)."""

import dataclasses
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest

from kvlab import gpus
from kvlab.gpus import GPU, GPUS
from kvlab.results import load_result

BRIEF = {"h200", "h100-sxm", "h20", "h800-sxm", "a100-40gb-sxm4", "a100-40gb-pcie",
         "a100-80gb-sxm4", "l40s", "rtx4090", "b200", "gh200"}


def test_the_table_holds_the_gpus_the_lab_models():
    assert BRIEF <= set(GPUS)
    assert gpus.REFERENCE == "h200" and GPUS["h200"].name == "NVIDIA H200"


@pytest.mark.parametrize("key", sorted(GPUS))
def test_every_entry_is_valid_and_sourced(key):
    g = GPUS[key]
    assert g.key == key
    assert dataclasses.replace(g) == g  # validation accepts it as it stands
    assert all(isinstance(getattr(g, f), int) for f in ("num_sms", "l2_bytes", "l2_partitions",
                                                          "memory_bytes", "boost_mhz"))
    assert g.sources and all(len(s) > 20 for s in g.sources)
    assert g.l2_bytes < g.memory_bytes and g.host_gbps < g.hbm_gbps
    assert g.fp8_tflops is None or g.fp8_tflops >= g.fp16_tflops
    assert set(g.unpublished_fields) <= {f.name for f in dataclasses.fields(g)}
    assert gpus.gpu(key) is g and gpus.gpu(g) is g
    assert hash(g) == hash(dataclasses.replace(g))  # frozen and hashable: usable as a key


@pytest.mark.parametrize(
    ("key", "num_sms", "l2_mib", "hbm_gbps", "host_gbps", "fp16_tflops"),
    [
        ("h200", 132, 60, 4800, 64, 989.5),
        ("h100-sxm", 132, 50, 3350, 64, 989.5),
        ("h20", 78, 60, 4000, 64, 148),
        ("h800-sxm", 132, 50, 3350, 64, 989.5),
        ("a100-40gb-pcie", 108, 40, 1555, 32, 312),  # KVPR's GPU: PCIe 4.0 x16 at 32 GB/s
        ("a100-80gb-sxm4", 108, 40, 2039, 32, 312),
        ("l40s", 142, 96, 864, 32, 362.05),
        ("rtx4090", 128, 72, 1008, 32, 165.2),  # FP32 accumulate, as PyTorch's GEMMs
        ("b200", 148, 126.5, 8000, 64, 2250),
        ("gh200", 132, 60, 4000, 450, 989.5),
    ],
)
def test_published_figures(key, num_sms, l2_mib, hbm_gbps, host_gbps, fp16_tflops):
    g = GPUS[key]
    assert (g.num_sms, g.l2_bytes / 2**20, g.hbm_gbps, g.host_gbps, g.fp16_tflops) == (
        num_sms, l2_mib, hbm_gbps, host_gbps, fp16_tflops)


def test_the_h200_entry_is_what_the_recordings_measured():
    h200, attention = GPUS["h200"], load_result("h200", "attention")
    assert (attention["gpu"], attention["num_sms"]) == (h200.name, h200.num_sms)
    assert attention["clocks_start"]["max_sm_mhz"] == h200.boost_mhz


def test_what_makers_do_not_publish_is_named():
    assert {"num_sms", "boost_mhz", "l2_bytes"} <= set(GPUS["h20"].unpublished_fields)
    assert "derived" in GPUS["b200"].unpublished_fields["boost_mhz"]
    assert "l2_bytes" in GPUS["gh200"].unpublished_fields
    assert GPUS["a100-40gb-sxm4"].unpublished == ()  # the whitepaper states everything


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_sms": 0}, "gpu 'h200': num_sms=0: must be an integer >= 1"),
        ({"num_sms": True}, "gpu 'h200': num_sms=True: must be an integer >= 1"),
        ({"l2_bytes": 1.5}, "gpu 'h200': l2_bytes=1.5: must be an integer >= 1"),
        ({"hbm_gbps": -1.0}, "gpu 'h200': hbm_gbps=-1.0: must be a finite number > 0"),
        ({"fp16_tflops": math.nan}, "gpu 'h200': fp16_tflops=nan: must be a finite number > 0"),
        ({"fp8_tflops": "1979"}, "gpu 'h200': fp8_tflops='1979': must be a finite number > 0"),
        ({"tdp_watts": 0}, "gpu 'h200': tdp_watts=0: must be a finite number > 0"),
        ({"host_link": " "}, "gpu 'h200': host_link=' ': must be a non-empty string"),
        ({"name": "H200"}, "gpu 'h200': name='H200': must be the driver's name"),
        ({"arch": "hopper"}, "gpu 'h200': arch='hopper': must be a compute capability"),
        ({"sources": ()}, r"gpu 'h200': sources=\(\): must be a non-empty tuple of strings"),
        ({"sources": "datasheet"}, "gpu 'h200': sources='datasheet': must be a non-empty tuple"),
        ({"unpublished": (("clock", "guess"),)}, r"gpu 'h200': unpublished=\(\('clock', "
         r"'guess'\),\): must be a tuple of \(field, note\) pairs"),
        ({"unpublished": (("num_sms", ""),)}, "gpu 'h200': unpublished="),
        ({"key": "H 200"}, "key='H 200': must be lower-case letters, digits"),
    ],
)
def test_a_bad_field_is_named_with_its_value(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(GPUS["h200"], **change)


def test_a_new_entry_needs_only_the_published_fields():
    g = GPU("rtx6000-ada", "NVIDIA RTX 6000 Ada Generation", "sm_89", num_sms=142,
            l2_bytes=96 * 2**20, l2_partitions=1, memory_bytes=48 * 10**9, hbm_gbps=960,
            host_link="PCIe 4.0 x16", host_gbps=32, fp16_tflops=364.2, boost_mhz=2505,
            sources=("NVIDIA RTX 6000 Ada Generation datasheet",))
    assert (g.fp8_tflops, g.tdp_watts, g.unpublished_fields) == (None, None, {})
    assert type(g.hbm_gbps) is float and gpus.detect(g.name) is None  # not in GPUS


def test_numpy_numbers_become_python_numbers():
    g = dataclasses.replace(GPUS["h200"], num_sms=np.int64(78), hbm_gbps=np.float32(4000))
    assert type(g.num_sms) is int and type(g.hbm_gbps) is float and g.num_sms == 78


@pytest.mark.parametrize("key", ["h300", "H200", "", None, 3, ["h200"]])
def test_an_unknown_key_names_gpu_and_lists_the_keys(key):
    with pytest.raises(ValueError, match=r"gpu=.*: must be one of \['a100-40gb-pcie'"):
        gpus.gpu(key)
    with pytest.raises(ValueError, match="gpu="):
        gpus.assumptions(key)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H20", "h20"),
        ("NVIDIA H800", "h800-sxm"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm4"),
        ("A100-SXM4-40GB", "a100-40gb-sxm4"),  # drivers before 470 left out "NVIDIA "
        ("NVIDIA A100-PCIE-40GB", "a100-40gb-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm4"),
        ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("  nvidia   h200\n", "h200"),
    ],
)
def test_detect_maps_driver_names_to_entries(name, key):
    assert gpus.detect(name) is GPUS[key]


@pytest.mark.parametrize(
    "name",
    [
        None,  # no GPU: kvlab.device._gpu_name() returns None
        "",
        "NVIDIA H200 NVL",  # PCIe card, 600 W: other figures than the SXM H200
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H800 PCIe",
        "NVIDIA H20-3e",
        "NVIDIA L40",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice of the SMs
        "NVIDIA GH200 144G HBM3e",
        "Tesla V100-SXM2-16GB",
        "AMD Instinct MI300X",
    ],
)
def test_detect_returns_none_for_what_the_table_does_not_hold(name):
    assert gpus.detect(name) is None


def test_detect_refuses_what_is_not_a_name():
    with pytest.raises(ValueError, match="name=42: must be a CUDA device name"):
        gpus.detect(42)


def test_every_entry_detects_from_its_own_name():
    assert all(gpus.detect(g.name) is g for g in GPUS.values())
    assert len({g.name.casefold() for g in GPUS.values()}) == len(GPUS)


def recorded_h200():
    """The H200's measured rates, read here independently of kvlab.gpus."""
    points = {(r["model"], r["batch"], r["context"]): r
              for r in load_result("h200", "kvpr_opt")["rows"]}
    return {
        "copy_roofline_gbps": load_result("h200", "attention")["roofline_copy_gbps"],
        "h2d_gbps": statistics.median(r["h2d_gbps"] for r in points.values()),
        "recompute_tflops": statistics.median(r["recompute_tflops"] for r in points.values()),
        "l2_gbps_per_sm": load_result("cpu", "l2_validation")["time_model"]["l2_gbps_per_sm"],
    }


def test_the_reference_rates_are_measured_and_labelled_so():
    recorded = recorded_h200()
    for name, rate in gpus.RATES.items():
        value, label = rate("h200")
        assert value == recorded[name]
        assert label.startswith("measured on the NVIDIA H200: ")
    assert 4000 < recorded["copy_roofline_gbps"] < 4800 and 50 < recorded["h2d_gbps"] < 64


@pytest.mark.parametrize("key", sorted(set(GPUS) - {"h200"}))
def test_another_gpu_takes_the_h200_share_of_its_own_spec(key):
    g, h200, recorded = GPUS[key], GPUS["h200"], recorded_h200()
    expected = {
        "copy_roofline_gbps": recorded["copy_roofline_gbps"] / h200.hbm_gbps * g.hbm_gbps,
        "h2d_gbps": recorded["h2d_gbps"] / h200.host_gbps * g.host_gbps,
        "recompute_tflops": recorded["recompute_tflops"] / h200.fp16_tflops * g.fp16_tflops,
        "l2_gbps_per_sm": recorded["l2_gbps_per_sm"] * g.boost_mhz / h200.boost_mhz,
    }
    for name, rate in gpus.RATES.items():
        value, label = rate(g)
        assert value == pytest.approx(expected[name], rel=1e-12)
        assert label.startswith("assumed: the NVIDIA H200's ") and g.name in label


def test_the_labels_carry_the_share_and_the_source():
    _, label = gpus.copy_roofline_gbps("a100-40gb-pcie")
    assert "4,280.7 of 4,800.0 GB/s (89.2%" in label and "attention.json" in label
    assert "1,555.0 GB/s" in label
    _, label = gpus.l2_gbps_per_sm("a100-40gb-pcie")
    assert "1,410 / 1,980 MHz" in label and "l2_validation.json" in label


def test_assumptions_name_each_unmeasured_input_and_each_unpublished_figure():
    assert gpus.assumptions("h200") == dict(GPUS["h200"].unpublished)  # its rates are measured
    a100 = gpus.assumptions("a100-40gb-sxm4")
    assert set(a100) == set(gpus.RATES) and all(v.startswith("assumed") for v in a100.values())
    h20 = gpus.assumptions(GPUS["h20"])
    assert set(gpus.RATES) | {"num_sms", "boost_mhz", "l2_bytes"} <= set(h20)
    assert "78" in h20["num_sms"]


def test_importing_the_table_and_the_paper_loads_nothing_heavy():
    code = ("import sys, kvlab.gpus, kvlab.offload.paper; "
            "print([m for m in ('torch', 'pandas', 'plotly') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
