"""Nsight Compute on kvlab decode kernels: the command, the subprocess, the parse.

`measure_many(specs)` runs ONE `ncu` on `python -m kvlab.profile.launch '<specs as JSON>'` in a
process group of its own (killed whole at `timeout_s`): the launcher makes each spec's cache and
plan and launches its decode kernel once, and ncu profiles every launch of the decode kernels
(`-k regex:vllm_decode|gqa_decode`), so its rows are the specs, in order. vllm_v1's v2 reduce
kernel (`vllm_reduce`) and gqa's split-KV merge kernel (`gqa_merge`) are NOT included.
`--cache-control all` (ncu's default) flushes the caches before each profiled launch, as the
benchmarks' cold-L2 timing does; `--clock-control none` leaves the clocks to the GPU (ncu would
lock them to base otherwise), so durations are at the clocks the benchmarks run at. One process
for many specs saves the start-up (Python, CUDA, compiling) that dominates a small case.

The counters (METRICS): our column, then ncu's metric, its name in ncu's sections, and the row
of the L2-prefetch paper's Table 5.2 (`kvlab.profile.paper`) it answers:
- l2_hit_pct: lts__t_sector_hit_rate.pct, "L2 Hit Rate" (Memory Workload Analysis); L2命中率.
- long_scoreboard_cycles:
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio, "Stall Long
  Scoreboard" in cycles per issued instruction (Warp State Statistics); Stall周期.
- cpi: smsp__average_warp_latency_per_inst_issued.ratio, "Warp Cycles Per Issued Instruction"
  (Warp State Statistics); CPI.
- sm_throughput_pct: sm__throughput.avg.pct_of_peak_sustained_elapsed, "Compute (SM)
  Throughput" (GPU Speed Of Light); 计算吞吐.
- memory_throughput_pct: gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,
  "Memory Throughput" (GPU Speed Of Light: the busiest of DRAM, L2 and L1); 内存吞吐.
- dram_throughput_pct: dram__throughput.avg.pct_of_peak_sustained_elapsed, "DRAM Throughput"
  (GPU Speed Of Light); no row.
- occupancy_pct: sm__warps_active.avg.pct_of_peak_sustained_active, "Achieved Occupancy"
  (Occupancy); no row.
- dram_read_bytes: dram__bytes_read.sum, bytes read from DRAM; no row.
- l2_read_bytes: lts__t_sectors_srcunit_tex_op_read.sum, the sectors the SMs' loads asked of L2,
  in bytes (32 a sector); no row. Against dram_read_bytes it shows how often L2 served each
  byte: a kernel that reads every byte once asks as many as DRAM gives, unless the same sector
  is asked again (docs/kernels/gqa.md tells of a version that did).
- l2_read_hit_bytes: lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum, those of the loads'
  sectors that hit in L2, in bytes; no row. Over l2_read_bytes it is the loads' own hit rate,
  which an L2 prefetch is meant to raise. l2_hit_pct counts every L2 lookup: the prefetches'
  own (they miss) and those of the fabric between the H200's two L2 partitions too (half a
  lookup more for each of the SMs'), so with a prefetch it reads lower (gqa with a bulk
  prefetch at distance 1, llama3-8b 16 x 4k: loads 48%, every lookup 33%; kvlab.sim.l2).
- duration_us: gpu__time_duration.sum, "Duration" (GPU Speed Of Light); 内核加速 is the ratio of
  two.
Percentages are of the peak; durations in microseconds; bytes in bytes.
"""

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from kvlab.checks import check_real
from kvlab.profile.spec import KernelSpec

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 1e6  # 11.6 days: the OS's poll waits at most 2**31 - 1 ms
# The profiled process (kvlab.profile.launch) writes, after each spec's launch, one line to
# stderr: SMS_MARKER, the spec's index, a space and the SMs its plan had.
SMS_MARKER = "kvlab.profile.launch: num_sms_used="
DECODE_KERNELS = {"vllm_v1": "vllm_decode", "gqa": "gqa_decode"}  # family -> CUDA kernel
# column -> (ncu metric, kind of unit); see the list above
METRICS = {
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct", "percent"),
    "long_scoreboard_cycles": (
        "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "ratio"),
    "cpi": ("smsp__average_warp_latency_per_inst_issued.ratio", "ratio"),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "percent"),
    "memory_throughput_pct": (
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "percent"),
    "dram_throughput_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "percent"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", "percent"),
    "dram_read_bytes": ("dram__bytes_read.sum", "bytes"),
    "l2_read_bytes": ("lts__t_sectors_srcunit_tex_op_read.sum", "sectors"),
    "l2_read_hit_bytes": ("lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum", "sectors"),
    "duration_us": ("gpu__time_duration.sum", "time"),
}
# kind -> {unit in ncu's units row: factor to ours}. ncu's prefixes are decimal. A unit not here
# is refused: it is one this parser has not been shown, not one to scale by 1.
# The units are those ncu 2025.3 printed on the H200 with --print-units base
# (tests/profile/data/ncu_raw_h200.csv): "cycle" for CPI, "inst" for the long-scoreboard ratio,
# "byte", "sector" and "ns"; the time and byte entries beside them are the same units, prefixed.
UNITS = {
    "percent": {"%": 1.0},
    "ratio": {"cycle": 1.0, "inst": 1.0},
    "bytes": {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12},
    "sectors": {"sector": 32.0},  # to bytes
    "time": {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6},
}
REASONS = ("not_found", "refused", "timeout", "failed", "no_kernel", "output")
PERMISSION_HELP = (
    "allow non-admin profiling on the host (NVIDIA driver option "
    "NVreg_RestrictProfilingToAdminUsers=0), or run as root or with CAP_SYS_ADMIN (CAP_PERFMON "
    "from driver R565); see https://developer.nvidia.com/ERR_NVGPUCTRPERM")


class CountersError(RuntimeError):
    """Why ncu gave no counters, in one line; `reason` is one of REASONS: ncu "not_found", it
    "refused" the counters (ERR_NVGPUCTRPERM), ran past its "timeout", "failed" (ncu or the
    profiled process exited with an error), profiled "no_kernel" matching, or wrote "output" this
    parser cannot read (a metric missing, not a number, or in an unknown unit)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def kernel_filter(specs: list[KernelSpec]) -> str:
    """ncu's --kernel-name filter for the specs' decode kernels."""
    names = sorted({DECODE_KERNELS[spec.kernel] for spec in specs})
    return f"regex:{'|'.join(names)}"


def command(specs: list[KernelSpec], ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles one launch of each spec's decode kernel."""
    return [ncu, "--csv", "--page", "raw", "--print-units", "base",
            "--cache-control", "all", "--clock-control", "none",
            "--kernel-name", kernel_filter(specs),
            "--metrics", ",".join(m for m, _ in METRICS.values()),
            sys.executable, "-m", "kvlab.profile.launch",
            json.dumps([json.loads(spec.to_json()) for spec in specs])]


def check_refusal(text: str) -> None:
    """Raise CountersError("refused") if ncu's output says it may not read the counters."""
    if "ERR_NVGPUCTRPERM" in text:
        raise CountersError("ncu refused the performance counters (ERR_NVGPUCTRPERM: this user "
                            f"may not read them): {PERMISSION_HELP}", "refused")


def parse(text: str, kernel: str = "the kernel filter", expected: int | None = 1,
          metrics: dict = METRICS) -> list[dict]:
    """The counters of each profiled launch from ncu's `--csv --page raw` output (its header row
    of metric names, its units row, then one row per profiled launch; ncu's own "==PROF==" lines
    among them): [{"kernel_name": ..., column: value in our units for each column of
    `metrics`}] (METRICS' form), in launch order. `kernel` names the filter in errors. Raises
    CountersError for a refusal, other than `expected` launches (None: any number but none),
    and a metric missing, not a number or in a unit not in UNITS."""
    check_refusal(text)
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    start = next((i for i, row in enumerate(rows) if row[:1] == ["ID"] and "Kernel Name" in row),
                 None)
    if start is None or len(rows) < start + 3:
        raise CountersError(f"ncu profiled no kernel matching {kernel}", "no_kernel")
    header, units, launches = rows[start], rows[start + 1], rows[start + 2:]
    if units[:1] != [""]:
        raise CountersError("ncu's CSV has no units row under its header", "output")
    if len(units) != len(header):
        raise CountersError(f"ncu's CSV units row has {len(units)} fields, its header "
                            f"{len(header)}", "output")
    if expected is not None and len(launches) != expected:
        raise CountersError(f"ncu profiled {len(launches)} launches matching {kernel}; "
                            f"expected {expected}", "output")
    unit_of = dict(zip(header, units, strict=True))
    found = []
    for launch in launches:
        if len(launch) != len(header):
            raise CountersError(f"ncu's CSV rows have {len(units)} and {len(launch)} fields, "
                                f"its header {len(header)}", "output")
        values = dict(zip(header, launch, strict=True))
        row = {"kernel_name": values["Kernel Name"]}
        for column, (metric, kind) in metrics.items():
            row[column] = _value(metric, values, unit_of, UNITS[kind])
        found.append(row)
    return found


def _value(metric: str, values: dict, unit_of: dict, scales: dict) -> float:
    if metric not in values:
        raise CountersError(f"metric {metric} missing from ncu's output", "output")
    text, unit = values[metric], unit_of[metric]
    if unit not in scales:
        raise CountersError(f"metric {metric}: unit {unit!r} unknown, expected one of "
                            f"{sorted(scales)}", "output")
    try:
        number = float(text.replace(",", ""))  # thousands separators: "1,234.5"
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise CountersError(f"metric {metric}: value {text!r} is not a number", "output")
    return number * scales[unit]


def measure_many(specs: list[KernelSpec], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 ncu: str = "ncu") -> list[dict]:
    """Profile one launch of each spec under one ncu: per spec, {its fields..., "num_sms_used"
    (the SMs its plan had), "kernel_name", the columns of METRICS}, plain JSON-able values.

    ncu: its name on PATH, or its path. timeout_s: seconds for ncu and the profiled process
    together (it compiles each kernel), at most MAX_TIMEOUT_S. Raises ValueError for bad
    arguments, before anything runs, and CountersError (see its `reason`) where ncu gives no
    whole row for every spec.
    """
    specs = list(specs) if isinstance(specs, (list, tuple)) else specs
    if not isinstance(specs, list) or not specs or not all(
            isinstance(s, KernelSpec) for s in specs):
        raise ValueError(f"specs={specs!r}: must be a non-empty list of KernelSpec")
    out, err = run_ncu(lambda path: command(specs, path), timeout_s, ncu)
    rows = parse(out, kernel_filter(specs), expected=len(specs))
    used = [line.removeprefix(SMS_MARKER).split() for line in err.splitlines()
            if line.startswith(SMS_MARKER)]
    if [u[0] for u in used] != [str(i) for i in range(len(specs))] or not all(
            len(u) == 2 and u[1].isdigit() for u in used):
        raise CountersError(f"the profiled process did not write one line '{SMS_MARKER}<index> "
                            f"<SMs>' per spec on stderr: {_last_words(out, err)}", "failed")
    return [{**asdict(spec), "num_sms_used": int(u[1]), **row}
            for spec, u, row in zip(specs, used, rows, strict=True)]


def run_ncu(command_of, timeout_s: float, ncu: str) -> tuple[str, str]:
    """(stdout, stderr) of the ncu command `command_of(ncu's path)`, run by `_run`. Raises
    ValueError for a timeout_s out of range, before anything runs, and CountersError where ncu
    is missing, refuses the counters, runs past timeout_s or exits with an error."""
    check_real("timeout_s", timeout_s, 0, MAX_TIMEOUT_S, open_min=True)
    path = shutil.which(ncu)
    if path is None:
        raise CountersError(f"ncu not found on PATH (ncu={ncu!r}): install Nsight Compute, or "
                            "pass ncu= the path of its ncu", "not_found")
    returncode, out, err = _run(command_of(path), timeout_s)
    check_refusal(out + err)
    if returncode != 0:
        raise CountersError(f"ncu exited with status {returncode}: {_last_words(out, err)}",
                            "failed")
    return out, err


def measure(spec: KernelSpec, *, timeout_s: float = DEFAULT_TIMEOUT_S, ncu: str = "ncu") -> dict:
    """`measure_many([spec])`'s one row."""
    if not isinstance(spec, KernelSpec):
        raise ValueError(f"spec={spec!r}: must be a KernelSpec")
    return measure_many([spec], timeout_s=timeout_s, ncu=ncu)[0]


def counters(specs, *, timeout_s: float = DEFAULT_TIMEOUT_S, ncu: str = "ncu"):
    """The hardware counters of one launch of each spec's decode kernel (a KernelSpec or a list
    of them), by Nsight Compute: a pandas DataFrame, one row per spec, the columns of
    `measure_many` (the counters: METRICS and the list in this module's doc). Raises ValueError
    for bad arguments and CountersError where ncu is missing, refuses the counters, runs past
    timeout_s, or gives no whole row."""
    import pandas as pd

    specs = [specs] if isinstance(specs, KernelSpec) else specs
    return pd.DataFrame(measure_many(specs, timeout_s=timeout_s, ncu=ncu))


def version(ncu: str = "ncu") -> str | None:
    """The last line of `ncu --version` (None where it does not run)."""
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[-1] if out.returncode == 0 and lines else None


def _run(args: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run `args` in a new process group; at timeout_s kill the whole group (ncu and the process
    it profiles) and raise CountersError("timeout")."""
    env = dict(os.environ)  # the profiled process imports this kvlab, installed or checked out
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()  # NOTE: not read: a process that left the group may hold them open
        proc.stderr.close()
        raise CountersError(f"ncu ran past timeout_s={timeout_s}; killed it and the profiled "
                            "process (their process group)", "timeout") from None
    return proc.returncode, out, err


def _last_words(out: str, err: str) -> str:
    """ncu's first ==ERROR== line and the profiled process's last line on stderr."""
    lines = [line.strip() for line in (out + "\n" + err).splitlines() if line.strip()]
    ncu_error = next((line for line in lines if line.startswith("==ERROR==")), None)
    own = [line.strip() for line in err.splitlines() if line.strip() and
           not line.startswith("==")]
    words = [w for w in (ncu_error, own[-1] if own else None) if w]
    return "; ".join(words) or "no output"
