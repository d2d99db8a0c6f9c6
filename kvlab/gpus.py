"""GPUs the lab can model: their published specifications, and which numbers were measured.

Each `GPU` holds what its maker publishes (SMs, L2, HBM and host-link bandwidth, tensor-core
FLOP/s, clock), with the sources; `unpublished` names each field the maker does not publish and
where its number comes from instead (a device query in a public report, or an inference).
Only the H200 has recordings in this repository; for every other GPU a quantity the models need
(the copy roofline, the L2 bandwidth per SM, the pinned host-link rate, the K, V recompute rate)
is an assumption, derived from the H200's measured share of its own spec and labelled so by
`copy_roofline_gbps`, `l2_gbps_per_sm`, `h2d_gbps`, `recompute_tflops` and `assumptions`.
"""

from __future__ import annotations

import functools
import re
import statistics
from dataclasses import dataclass, fields

from kvlab.checks import check_int, check_real, is_real
from kvlab.results import load_result

__all__ = ["GPU", "GPUS", "REFERENCE", "assumptions", "copy_roofline_gbps", "detect", "gpu",
           "h2d_gbps", "l2_gbps_per_sm", "recompute_tflops"]

REFERENCE = "h200"  # the GPU whose recordings (benchmarks/results/h200/) calibrate the others
KEY = re.compile(r"[a-z0-9][a-z0-9.-]*")
ARCH = re.compile(r"sm_\d{2,3}[a-z]?")


@dataclass(frozen=True)
class GPU:
    """One GPU's published specification. Validated on construction (ValueError naming the GPU,
    the field and its value).

    key: short name, e.g. "h200" (the folder of its recordings under benchmarks/results/).
    name: as the CUDA driver reports it, e.g. "NVIDIA H200".
    arch: the compute capability as nvcc names it, e.g. "sm_90".
    num_sms: streaming multiprocessors.
    l2_bytes: L2 cache size, as cudaDeviceProp.l2CacheSize reports it.
    l2_partitions: L2 partitions (an SM reads the far one through a fabric).
    memory_bytes: device memory (bytes, as the maker counts GB: 1e9).
    hbm_gbps: peak DRAM bandwidth, GB/s (1e9 bytes/s).
    host_link: how the GPU reaches host memory, e.g. "PCIe 5.0 x16".
    host_gbps: the host link's peak bandwidth per direction, GB/s.
    fp16_tflops: dense fp16 tensor-core TFLOP/s (no sparsity; FP32 accumulate where it differs).
    boost_mhz: the SM boost clock.
    sources: where each number comes from (URLs or document titles).
    fp8_tflops: dense fp8 tensor-core TFLOP/s, None where the GPU has no fp8 tensor cores.
    tdp_watts: the board's maximum power, None where only a module's range is published.
    unpublished: (field, where its number comes from) for each field the maker does not publish.
    """

    key: str
    name: str
    arch: str
    num_sms: int
    l2_bytes: int
    l2_partitions: int
    memory_bytes: int
    hbm_gbps: float
    host_link: str
    host_gbps: float
    fp16_tflops: float
    boost_mhz: int
    sources: tuple[str, ...]
    fp8_tflops: float | None = None
    tdp_watts: float | None = None
    unpublished: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if not isinstance(self.key, str) or not KEY.fullmatch(self.key):
            raise ValueError(f"key={self.key!r}: must be lower-case letters, digits, '.' or '-'")
        try:
            self._check()
        except ValueError as error:
            raise ValueError(f"gpu {self.key!r}: {error}") from None

    def _check(self) -> None:
        for name in ("name", "host_link"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name}={value!r}: must be a non-empty string")
        if not self.name.startswith("NVIDIA "):
            raise ValueError(f"name={self.name!r}: must be the driver's name, 'NVIDIA ...'")
        if not isinstance(self.arch, str) or not ARCH.fullmatch(self.arch):
            raise ValueError(f"arch={self.arch!r}: must be a compute capability such as 'sm_90'")
        for name in ("num_sms", "l2_bytes", "l2_partitions", "memory_bytes", "boost_mhz"):
            check_int(name, getattr(self, name), 1)
            object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("hbm_gbps", "host_gbps", "fp16_tflops", "fp8_tflops", "tdp_watts"):
            value = getattr(self, name)
            if value is None and name in ("fp8_tflops", "tdp_watts"):
                continue
            check_real(name, value, 0, open_min=True)
            object.__setattr__(self, name, float(value))
        if (not isinstance(self.sources, tuple) or not self.sources
                or not all(isinstance(s, str) and s.strip() for s in self.sources)):
            raise ValueError(f"sources={self.sources!r}: must be a non-empty tuple of strings")
        names = {f.name for f in fields(self)} - {"key", "sources", "unpublished"}
        if not isinstance(self.unpublished, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and p[0] in names
                and isinstance(p[1], str) and p[1].strip() for p in self.unpublished):
            raise ValueError(f"unpublished={self.unpublished!r}: must be a tuple of (field, "
                             f"note) pairs, each field one of {sorted(names)}")

    @property
    def unpublished_fields(self) -> dict[str, str]:
        """Field -> where its number comes from, for each field the maker does not publish."""
        return dict(self.unpublished)


_HOPPER_L2_PARTITIONS = ("l2_partitions", "2, as the A100 whitepaper states for GA100; NVIDIA "
                         "does not state Hopper's count (chipsandcheese.com, 'Nvidia's H100: "
                         "Funny L2, and Tons of Bandwidth', measures a near and a far L2)")
_ADA_L2_PARTITIONS = ("l2_partitions", "assumed 1: NVIDIA describes no L2 partitions for AD102")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (40 GB HBM2 1,555 GB/s; 80 GB HBM2e 1,935 GB/s "
         "PCIe, 2,039 GB/s SXM; FP16 312 TFLOPS dense; PCIe Gen4 64 GB/s; 250/300 W PCIe, 400 W "
         "SXM)",
         "NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs, 40 MB L2 in two "
         "partitions, 1,410 MHz boost)",
         "deviceQuery of an A100 40GB (upb-pc2.atlassian.net, 'NVIDIA A100 40GB with NVLINK': "
         "L2 41,943,040 B, max clock 1,410 MHz)")
_A100_SPEC = dict(arch="sm_80", num_sms=108, l2_bytes=40 * 2**20, l2_partitions=2,
                  host_link="PCIe 4.0 x16", host_gbps=32.0, fp16_tflops=312.0, boost_mhz=1410)
_HOPPER = dict(arch="sm_90", l2_partitions=2, fp16_tflops=989.5, fp8_tflops=1979.0)

GPUS: dict[str, GPU] = {
    g.key: g for g in (
        GPU("h200", "NVIDIA H200", num_sms=132, l2_bytes=60 * 2**20, memory_bytes=141 * 10**9,
            hbm_gbps=4800.0, host_link="PCIe 5.0 x16", host_gbps=64.0, boost_mhz=1980,
            tdp_watts=700, **_HOPPER,
            sources=("NVIDIA H200 Tensor Core GPU datasheet (141 GB HBM3e, 4.8 TB/s, FP16 1,979 "
                     "and FP8 3,958 TFLOPS with sparsity, PCIe Gen5 128 GB/s, up to 700 W)",
                     "cudaDeviceProp and nvidia-smi on the lab's H200 (132 SMs, L2 62,914,560 "
                     "B, max SM clock 1,980 MHz: num_sms and clocks in every recording under "
                     "benchmarks/results/h200/)"),
            unpublished=(_HOPPER_L2_PARTITIONS,)),
        GPU("h100-sxm", "NVIDIA H100 80GB HBM3", num_sms=132, l2_bytes=50 * 2**20,
            memory_bytes=80 * 10**9, hbm_gbps=3350.0, host_link="PCIe 5.0 x16", host_gbps=64.0,
            boost_mhz=1980, tdp_watts=700, **_HOPPER,
            sources=("NVIDIA H100 Tensor Core GPU datasheet (SXM: 80 GB, 3.35 TB/s, FP16 1,979 "
                     "and FP8 3,958 TFLOPS with sparsity, PCIe Gen5 128 GB/s, up to 700 W)",
                     "deviceQuery of an H100 80GB HBM3 (github.com/thamada/nvidia-smi, "
                     "nvsim/H100SXMx8_deviceQuery.py: 132 SMs, L2 52,428,800 B, 1,980 MHz)"),
            unpublished=(_HOPPER_L2_PARTITIONS,)),
        GPU("h20", "NVIDIA H20", arch="sm_90", num_sms=78, l2_bytes=60 * 2**20, l2_partitions=2,
            memory_bytes=96 * 10**9, hbm_gbps=4000.0, host_link="PCIe 5.0 x16", host_gbps=64.0,
            fp16_tflops=148.0, fp8_tflops=296.0, boost_mhz=1980, tdp_watts=400,
            sources=("NVIDIA H20 specifications as published for the China market (96 GB HBM3, "
                     "4.0 TB/s, FP16 148 and FP8 296 TFLOPS dense, PCIe Gen5 x16, 400 W; "
                     "willitrunai.com/gpus/h20-96gb)",
                     "arXiv 2504.06319, section 5.1 (kvlab's seeds/000): H20, 96 GB HBM, 60 MB "
                     "L2, 4.0 TB/s"),
            unpublished=(("num_sms", "78 from Geekbench 6 device reports (zangshuxian.com/new/"
                          "674733024499207168) and a public benchmark log ('GPU: NVIDIA H20, 78 "
                          "SMs'); NVIDIA publishes no SM count"),
                         ("l2_bytes", "60 MB as arXiv 2504.06319 gives it, taken as 60 MiB, as "
                          "cudaDeviceProp reports the H200's (both have 6 HBM stacks)"),
                         ("boost_mhz", "assumed GH100's 1,980 MHz (H100 SXM, H200); NVIDIA "
                          "publishes no H20 clock"),
                         _HOPPER_L2_PARTITIONS)),
        GPU("h800-sxm", "NVIDIA H800", num_sms=132, l2_bytes=50 * 2**20, memory_bytes=80 * 10**9,
            hbm_gbps=3350.0, host_link="PCIe 5.0 x16", host_gbps=64.0, boost_mhz=1980,
            tdp_watts=700, **_HOPPER,
            sources=("NVIDIA H800 Tensor Core GPU datasheet (SXM: 80 GB HBM3, 3.35 TB/s, FP16 "
                     "1,979 and FP8 3,958 TFLOPS with sparsity, NVLink 400 GB/s, PCIe Gen5 128 "
                     "GB/s, 700 W)",),
            unpublished=(("num_sms", "132, the H100 SXM's: the H800 SXM is an H100 SXM with "
                          "NVLink cut to 400 GB/s and FP64 to 1 TFLOPS"),
                         ("l2_bytes", "50 MiB, the H100 SXM's (5 HBM3 stacks, 10 controllers)"),
                         ("boost_mhz", "1,980 MHz, the H100 SXM's"), _HOPPER_L2_PARTITIONS)),
        GPU("a100-40gb-sxm4", "NVIDIA A100-SXM4-40GB", memory_bytes=40 * 10**9, hbm_gbps=1555.0,
            tdp_watts=400, sources=_A100, **_A100_SPEC),
        GPU("a100-40gb-pcie", "NVIDIA A100-PCIE-40GB", memory_bytes=40 * 10**9, hbm_gbps=1555.0,
            tdp_watts=250, **_A100_SPEC,
            sources=(*_A100, "NVIDIA A100 40GB PCIe GPU Accelerator product brief PB-10137-001 "
                     "(PCI Express Gen4 card, 250 W)")),
        GPU("a100-80gb-sxm4", "NVIDIA A100-SXM4-80GB", memory_bytes=80 * 10**9, hbm_gbps=2039.0,
            tdp_watts=400, sources=_A100, **_A100_SPEC),
        GPU("a100-80gb-pcie", "NVIDIA A100 80GB PCIe", memory_bytes=80 * 10**9, hbm_gbps=1935.0,
            tdp_watts=300, sources=_A100, **_A100_SPEC),
        GPU("l40s", "NVIDIA L40S", arch="sm_89", num_sms=142, l2_bytes=96 * 2**20,
            l2_partitions=1, memory_bytes=48 * 10**9, hbm_gbps=864.0, host_link="PCIe 4.0 x16",
            host_gbps=32.0, fp16_tflops=362.05, fp8_tflops=733.0, boost_mhz=2520, tdp_watts=350,
            sources=("NVIDIA L40S datasheet (48 GB GDDR6, 864 GB/s, FP16 362.05 and FP8 733 "
                     "TFLOPS dense, PCIe Gen4 x16 64 GB/s bidirectional, 350 W)",
                     "deviceQuery of an L40S (crates.io cuda-device-query, README: 142 SMs, L2 "
                     "100,663,296 B, max clock 2,520 MHz)"),
            unpublished=(("l2_bytes", "from the deviceQuery report; the datasheet gives none"),
                         _ADA_L2_PARTITIONS)),
        GPU("rtx4090", "NVIDIA GeForce RTX 4090", arch="sm_89", num_sms=128, l2_bytes=72 * 2**20,
            l2_partitions=1, memory_bytes=24 * 10**9, hbm_gbps=1008.0,
            host_link="PCIe 4.0 x16", host_gbps=32.0, fp16_tflops=165.2, fp8_tflops=330.3,
            boost_mhz=2520, tdp_watts=450,
            sources=("NVIDIA Ada Lovelace GPU architecture whitepaper, appendix (RTX 4090: 128 "
                     "SMs, 72 MB L2, 1,008 GB/s, 2,520 MHz boost, 450 W; dense FP16 tensor 165.2 "
                     "TFLOPS with FP32 accumulate, as PyTorch's GEMMs accumulate (330.3 with "
                     "FP16 accumulate); FP8 330.3 with FP32 accumulate)",
                     "nvbench PR #207 log (github.com/NVIDIA/nvbench): 128 SMs, L2 73,728 KiB, "
                     "2,520 MHz"),
            unpublished=(_ADA_L2_PARTITIONS,)),
        GPU("b200", "NVIDIA B200", arch="sm_100", num_sms=148, l2_bytes=132_644_864,
            l2_partitions=2, memory_bytes=180 * 10**9, hbm_gbps=8000.0,
            host_link="PCIe 5.0 x16", host_gbps=64.0, fp16_tflops=2250.0, fp8_tflops=4500.0,
            boost_mhz=1855, tdp_watts=1000,
            sources=("NVIDIA HGX B200 / DGX B200 datasheets (8 GPUs: 1,440 GB HBM3e, 180 GB "
                     "each; FP16 36 and FP8 72 PFLOPS with sparsity, 2,250 and 4,500 TFLOPS "
                     "dense each; 8 TB/s; 1,000 W)",
                     "device query in github.com/pytorch/ao PR #4002: 148 SMs, L2 126.50 MB, "
                     "compute capability 10.0, 7,680-bit bus (7.67 TB/s at 3,996 MHz)"),
            unpublished=(("num_sms", "148 from the device query in pytorch/ao PR #4002"),
                         ("l2_bytes", "126.5 MiB from the same device query"),
                         ("l2_partitions", "assumed 2: one L2 per die of the two"),
                         ("boost_mhz", "derived: 2,250 TFLOPS / (148 SMs x 8,192 dense FP16 "
                          "FLOP per clock, twice Hopper's per SM) = 1,855 MHz; NVIDIA "
                          "publishes no B200 clock"),
                         ("host_link", "PCIe 5.0 x16 as HGX/DGX B200 hosts (Xeon Platinum 8570) "
                          "run it (vengineer.hatenablog.com, 2025-04-24); the B200 supports "
                          "PCIe 6.0"))),
        GPU("gh200", "NVIDIA GH200 480GB", num_sms=132, l2_bytes=60 * 2**20,
            memory_bytes=96 * 10**9, hbm_gbps=4000.0, host_link="NVLink-C2C", host_gbps=450.0,
            boost_mhz=1980, **_HOPPER,
            sources=("NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3 at 4 TB/s; FP16 "
                     "990 and FP8 1,979 TFLOPS dense; NVLink-C2C 900 GB/s CPU-GPU; module "
                     "450-1,000 W configurable)",
                     "OpenCL device report of an NVIDIA GH200 480GB (github.com/mredenti/"
                     "PowerCapping, configuration/OpenCL_benchmark.md: 132 compute units at "
                     "1,980 MHz)"),
            unpublished=(("l2_bytes", "inferred 60 MiB: 6 HBM3 stacks on all 12 memory "
                          "controllers, as the H200 and H20"),
                         ("host_gbps", "450 GB/s: half of NVLink-C2C's 900 GB/s, both ways"),
                         _HOPPER_L2_PARTITIONS)),
    )
}


def gpu(key) -> GPU:
    """The GPU `key` names (a key of GPUS); a GPU passes through. Raises ValueError naming it and
    listing the keys."""
    if isinstance(key, GPU):
        return key
    if not isinstance(key, str) or key not in GPUS:
        raise ValueError(f"gpu={key!r}: must be one of {sorted(GPUS)}")
    return GPUS[key]


def _normal(name: str) -> str:
    name = " ".join(name.split()).casefold()
    return name.removeprefix("nvidia ")


_BY_NAME = {_normal(g.name): g.key for g in GPUS.values()}


def detect(name: str | None) -> GPU | None:
    """The table's GPU that a CUDA device name (torch.cuda.get_device_name, kvlab.device's
    `_gpu_name`) reports, or None: for no GPU (None), a GPU not in the table, and a variant of
    one whose figures differ (an H200 NVL, an H100 PCIe, an RTX 4090 D, a MIG instance). Case,
    spacing and a missing "NVIDIA " prefix (older drivers: "A100-SXM4-40GB") do not matter.
    Raises ValueError naming `name` when it is neither a string nor None."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise ValueError(f"name={name!r}: must be a CUDA device name (a string) or None")
    key = _BY_NAME.get(_normal(name))
    return None if key is None else GPUS[key]


@functools.cache
def _reference_rates() -> dict[str, tuple[float, str]]:
    """The reference's measured rates: name -> (value, where it was measured)."""
    attention = load_result(REFERENCE, "attention", keys={"roofline_copy_gbps": float})
    kvpr = load_result(REFERENCE, "kvpr_opt", keys={"rows": (
        "model", "batch", "context", "h2d_gbps", "recompute_tflops")})
    fit = load_result("cpu", "l2_validation", keys={"time_model": dict})["time_model"]
    if not is_real(fit.get("l2_gbps_per_sm")) or not fit["l2_gbps_per_sm"] > 0:
        raise ValueError(f"results/cpu/l2_validation.json: time_model has no l2_gbps_per_sm > 0: "
                         f"{fit!r}")
    points = {(r["model"], r["batch"], r["context"]): r for r in kvpr["rows"]}  # rates per point
    where = f"the median of {len(points)} points of benchmarks/results/{REFERENCE}/kvpr_opt.json"
    return {
        "copy_roofline_gbps": (attention["roofline_copy_gbps"], f"benchmarks/results/"
                               f"{REFERENCE}/attention.json, roofline_copy_gbps"),
        "h2d_gbps": (statistics.median(r["h2d_gbps"] for r in points.values()),
                     f"pinned host-to-device copies, {where}"),
        "recompute_tflops": (statistics.median(r["recompute_tflops"] for r in points.values()),
                             f"the K, V recomputation of OPT layers, {where}"),
        "l2_gbps_per_sm": (fit["l2_gbps_per_sm"], "fitted to the H200's recorded launch times "
                           "(results/cpu/l2_validation.json, time_model)"),
    }


# rate -> (the GPU field it is a share of, its unit, how the share carries over)
_SHARES = {
    "copy_roofline_gbps": ("hbm_gbps", "GB/s", "an HBM3e share, applied to any DRAM"),
    "h2d_gbps": ("host_gbps", "GB/s", "a PCIe 5.0 share, applied to any host link"),
    "recompute_tflops": ("fp16_tflops", "TFLOP/s", "a share of Hopper's tensor cores"),
}


def _share(g, rate: str) -> tuple[float, str]:
    g, ref = gpu(g), GPUS[REFERENCE]
    value, where = _reference_rates()[rate]
    spec, unit, caveat = _SHARES[rate]
    if g.key == REFERENCE:
        return value, f"measured on the {ref.name}: {where}"
    share = value / getattr(ref, spec)
    return share * getattr(g, spec), (
        f"assumed: the {ref.name}'s measured share of its spec, {value:,.1f} of "
        f"{getattr(ref, spec):,.1f} {unit} ({share:.1%}; {where}), times the {g.name}'s "
        f"{getattr(g, spec):,.1f} {unit} ({caveat})")


def copy_roofline_gbps(g) -> tuple[float, str]:
    """(GB/s a device-to-device copy reaches, "measured ..." or "assumed: ...") for GPU `g` (a
    GPU or a key): the time model's DRAM rate (kvlab.sim.time_model)."""
    return _share(g, "copy_roofline_gbps")


def h2d_gbps(g) -> tuple[float, str]:
    """(GB/s of pinned host-to-device copies, label): KVPR's v_com."""
    return _share(g, "h2d_gbps")


def recompute_tflops(g) -> tuple[float, str]:
    """(TFLOP/s of the K, V recomputation, label): KVPR's v_gpu."""
    return _share(g, "recompute_tflops")


def l2_gbps_per_sm(g) -> tuple[float, str]:
    """(L2 GB/s per SM, label): the time model's L2 rate, fitted on the H200 and, for another
    GPU, scaled by its boost clock (the same bytes per SM per clock)."""
    g, ref = gpu(g), GPUS[REFERENCE]
    value, where = _reference_rates()["l2_gbps_per_sm"]
    if g.key == REFERENCE:
        return value, f"measured on the {ref.name}: {where}"
    return value * g.boost_mhz / ref.boost_mhz, (
        f"assumed: the {ref.name}'s {value:.1f} GB/s per SM ({where}) times the {g.name}'s "
        f"boost clock over the H200's, {g.boost_mhz:,} / {ref.boost_mhz:,} MHz (the same bytes "
        f"per SM per clock as Hopper)")


RATES = {"copy_roofline_gbps": copy_roofline_gbps, "l2_gbps_per_sm": l2_gbps_per_sm,
         "h2d_gbps": h2d_gbps, "recompute_tflops": recompute_tflops}


def assumptions(g) -> dict[str, str]:
    """What the models take for GPU `g` (a GPU or a key) that was not measured there: each rate
    of RATES that is assumed, with how it is derived, then each spec field its maker does not
    publish, with where the number comes from. Empty where everything is measured or published.
    ValueError for an unknown key, or where a recording the rates need is absent."""
    g = gpu(g)
    derived = {name: rate(g)[1] for name, rate in RATES.items()}
    return ({name: label for name, label in derived.items() if label.startswith("assumed")}
            | g.unpublished_fields)
