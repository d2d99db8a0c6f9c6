"""What a benchmark result records about where, when and by what code it ran.

The code: the git revision of the checkout kvlab runs from, and whether its tree differed from
that revision (`benchmarks/results/`, where results are written, does not count). A copy of a
checkout without its `.git` folder (a device machine, say) takes both from the environment:
KVLAB_GIT_REVISION (40 hex digits) and KVLAB_GIT_DIRTY ("0" or "1"), set by whoever made the
copy. An installed kvlab has neither: the revision is then None, and such a result cannot be
resumed (`kvlab.bench.kvpr`), since nothing shows which code made it. Either way the result
records every component's version (`kvlab.components`: a hash of its files), which an installed
kvlab computes as a checkout does. The GPU tests and sanitizers run before the benchmark on
the same code (benchmarks/device_run.sh) are recorded too, from KVLAB_GPU_CHECKS (`gpu_checks`).
`write_checkpoint` saves a result as it stands, for the benchmarks' --checkpoint.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

from kvlab import components

# The folder holding the kvlab package: a git checkout's top level when kvlab runs from one.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
RESULTS = "benchmarks/results"
VERSIONED = ("numpy", "torch", "cupy", "transformers")
# nvidia-smi's field -> our key; all numbers but the driver's version and the GPU's UUID
NVIDIA_SMI_FIELDS = {"driver_version": "driver_version", "uuid": "uuid", "clocks.sm": "sm_mhz",
                     "clocks.mem": "mem_mhz", "clocks.max.sm": "max_sm_mhz",
                     "clocks.max.mem": "max_mem_mhz", "temperature.gpu": "temperature_c"}
NVIDIA_SMI_TEXT = ("driver_version", "uuid")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def pin_to_one_core() -> int | None:
    """Pin this process to the first core it may run on; returns that core (None if unsupported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    core = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {core})
    return core


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_ROOT), *args], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    """{"git_revision", "git_dirty", "git_source"}: the revision of the checkout kvlab runs from
    and whether its tree (results aside) differs from it; from the environment where there is
    no checkout (see the module doc); None each where neither tells."""
    top = _git("rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == PACKAGE_ROOT:
        status = _git("status", "--porcelain", "--", ".", f":(exclude){RESULTS}")
        return {"git_revision": _git("rev-parse", "HEAD"), "git_dirty": status != "",
                "git_source": "checkout"}
    revision, dirty = os.environ.get("KVLAB_GIT_REVISION"), os.environ.get("KVLAB_GIT_DIRTY")
    if revision is None:
        return {"git_revision": None, "git_dirty": None, "git_source": None}
    if not re.fullmatch(r"[0-9a-f]{40}", revision) or dirty not in ("0", "1"):
        raise ValueError(f"KVLAB_GIT_REVISION={revision!r}, KVLAB_GIT_DIRTY={dirty!r}: must be "
                         "40 hex digits and '0' or '1'")
    return {"git_revision": revision, "git_dirty": dirty == "1", "git_source": "environment"}


def versions() -> dict:
    """The versions of the libraries a measurement depends on (None where not installed)."""
    found = {}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    if found["cupy"] is None:  # CuPy's wheels are named for their CUDA: cupy-cuda12x, ...
        found["cupy"] = next((d.version for d in importlib.metadata.distributions()
                              if (d.metadata["Name"] or "").startswith("cupy-cuda")), None)
    return found


def _nvidia_smi(index: int) -> dict:
    """NVIDIA_SMI_FIELDS of GPU `index` as nvidia-smi reads them ({} where it cannot), numbers
    as floats (None where not a number), NVIDIA_SMI_TEXT as text."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--format=csv,noheader,nounits",
             f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}"],
            capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    values = [v.strip() for v in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(values) != len(NVIDIA_SMI_FIELDS):
        return {}
    found = dict(zip(NVIDIA_SMI_FIELDS.values(), values, strict=True))
    return {key: value if key in NVIDIA_SMI_TEXT else
            float(value) if re.fullmatch(r"[0-9.]+", value) else None
            for key, value in found.items()}


def gpu_state(index: int = 0) -> dict:
    """The SM and memory clocks (now and their maximum, MHz) and the temperature of GPU `index`:
    {} where nvidia-smi cannot read them."""
    state = _nvidia_smi(index)
    for key in NVIDIA_SMI_TEXT:
        state.pop(key, None)
    return state


def gpu_info(index: int = 0) -> dict:
    """The GPU a benchmark runs on: its name, SM count, the CUDA version torch was built with,
    the driver, the GPU's UUID ("GPU-..." as nvidia-smi names it; torch's where nvidia-smi
    cannot tell, None where neither can), and `gpu_state` now, as "clocks_start" ("clocks_end"
    is added at the end)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    state = _nvidia_smi(index)
    uuid = state.pop("uuid", None) or _torch_uuid(props)
    return {"gpu": props.name, "num_sms": props.multi_processor_count,
            "torch_cuda": torch.version.cuda, "driver": state.pop("driver_version", None),
            "gpu_uuid": uuid, "clocks_start": state}


def _torch_uuid(props) -> str | None:
    """torch's UUID of the GPU of `props` in nvidia-smi's form, "GPU-<uuid>"; None where torch
    has none."""
    uuid = getattr(props, "uuid", None)
    return None if uuid is None else f"GPU-{uuid}"


GPU_CHECKS = ("tests", "memcheck", "racecheck")  # what KVLAB_GPU_CHECKS may tell


def gpu_checks() -> dict | None:
    """The GPU tests and sanitizers run on this code before the benchmark, as
    benchmarks/device_run.sh sets KVLAB_GPU_CHECKS: a JSON object of GPU_CHECKS' keys, each a
    summary line ("40 passed, 233 deselected", "0 errors", ...). None where it is not set.
    Raises ValueError for a value that is not such an object."""
    text = os.environ.get("KVLAB_GPU_CHECKS")
    if text is None:
        return None
    try:
        checks = json.loads(text)
    except json.JSONDecodeError:
        checks = None
    if (not isinstance(checks, dict) or not set(checks) <= set(GPU_CHECKS)
            or not all(isinstance(v, str) for v in checks.values())):
        raise ValueError(f"KVLAB_GPU_CHECKS={text!r}: must be a JSON object of strings with "
                         f"keys among {GPU_CHECKS}")
    return checks


def run_info() -> dict:
    """When and where (the host's name) a benchmark runs, and by what code: the git state,
    every component's version (`kvlab.components`, `{name: version}`) and, where the device
    script ran them first, the GPU tests and sanitizers (`gpu_checks`)."""
    import kvlab

    checks = gpu_checks()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kvlab": kvlab.__version__,
        **git_state(),
        "components": components.versions(),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "versions": versions(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        **({"gpu_checks": checks} if checks is not None else {}),
    }


def write_json(path: str, result: dict, indent: int | None = None) -> None:
    """Write `result` as JSON at `path`, serialized whole before the file is opened: a value JSON
    cannot hold raises (TypeError, ValueError) with the file there, a checkpoint of the points
    before, left as it was."""
    text = json.dumps(result, indent=indent) + "\n"
    with open(path, "w") as f:
        f.write(text)


def write_checkpoint(path: str | None, result: dict) -> None:
    """Rewrite `result` as it stands as JSON at `path` (a benchmark's --checkpoint), if given: a
    run cut short keeps what it measured."""
    if path is not None:
        write_json(path, result)
