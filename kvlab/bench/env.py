"""What a benchmark result records about where and when it ran."""

import datetime
import os
import platform
import sys


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


def run_info() -> dict:
    import kvlab

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "kvlab": kvlab.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_name(),
    }
