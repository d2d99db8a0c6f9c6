"""The code a recorded result measured, in components, each with a version: a short hash of its
source files' bytes.

A component is a list of files named from the repository's top level (`kernels/...`,
`kvlab/...`). Its version is the first VERSION_HEX hex digits of the sha256 over each file's
name and bytes, in the listed order; it is None where a file is absent (a recording made before
the file existed: the component has changed since). Only what the wheel ships is versioned
(`kernels/` ships as `kvlab/csrc/`), so a version, and every label made from it, reads the same
installed as in the checkout it was built from; the driver scripts under `benchmarks/` are not
versioned. `BENCHMARKS` names the components each benchmark runs (a result's "benchmark").
Pure Python: no torch.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

__all__ = ["BENCHMARKS", "COMPONENTS", "benchmark_components", "digest", "source_path",
           "version", "versions"]

PACKAGE_DIR = Path(__file__).resolve().parent  # kvlab/, in a checkout or installed
CHECKOUT_DIR = PACKAGE_DIR.parent  # a checkout's top level (in a wheel: site-packages)
PACKAGED_KERNELS = PACKAGE_DIR / "csrc"  # where the wheel puts `kernels/`
VERSION_HEX = 12


def _in(folder: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{folder}/{name}" for name in names)


# name -> its files. NOTE: tests/test_components.py checks that every file named exists and
# that every .py of kvlab/ and every CUDA C file of kernels/ is in a component or UNMEASURED.
COMPONENTS: dict[str, tuple[str, ...]] = {
    # The kernels: CUDA C with its launcher (the headers each .cu includes)
    "gqa": _in("kernels", "paged_decode_gqa.cu", "prefetch.cuh", "timeline.cuh")
    + ("kvlab/kernels/gqa.py",),
    "vllm_v1": _in("kernels", "paged_decode_vllm.cu", "dtypes.cuh", "prefetch.cuh")
    + ("kvlab/kernels/vllm_v1.py",),
    "vllm_own": ("kvlab/kernels/vllm_own.py",),  # the launch; the cubin is recorded apart
    "flashinfer": ("kvlab/kernels/flashinfer_peer.py",),  # the adapter; its wheel pinned there
    "numba": ("kernels/prefetch_numba.cu", "kvlab/kernels/numba_decode.py"),
    "read": ("kernels/read_bytes.cu", "kernels/timeline.cuh", "kvlab/kernels/read.py"),
    "layer_ops": _in("kernels", "layer_ops.cu", "dtypes.cuh", "prefetch.cuh",
                     "prefetch_ahead.cuh") + ("kvlab/kernels/layer_ops.py",),
    "green": ("kernels/sm_ids.cu", "kvlab/kernels/green.py"),
    "tracer": ("kernels/timeline.cuh", "kvlab/kernels/timeline.py"),
    # The decode plan: geometry, the split, the family chosen, the prefetch, the loader
    "decode_plan": _in("kvlab/kernels", "__init__.py", "decode.py", "families.py", "geometry.py",
                       "launch.py", "loader.py", "prefetch.py", "select.py", "tune.py"),
    "base": _in("kvlab", "__init__.py", "__main__.py", "arith.py", "checks.py", "config.py",
                "device.py", "gpus.py", "reference.py", "workload.py"),
    "cache": _in("kvlab/cache", "__init__.py", "accounting.py", "block_manager.py",
                 "block_pool.py", "filled.py", "fp8.py", "paged_cache.py"),
    "model": _in("kvlab/model", "__init__.py", "attention.py", "hf.py", "layer.py", "norm.py",
                 "rope.py", "weights.py"),
    "engine": _in("kvlab/engine", "__init__.py", "checkpoint.py", "config.py", "forward.py",
                  "generation.py", "graphs.py", "hf.py", "llm.py", "offloaded.py", "runner.py",
                  "scheduler.py", "tp.py", "weights.py"),
    "kvpr": _in("kvlab/offload", "__init__.py", "graphs.py", "host.py", "loop.py", "overlap.py",
                "paper.py", "profiler.py", "recompute.py", "runtime.py", "scheduler.py",
                "weights.py"),
    "profile": _in("kvlab/profile", "__init__.py", "launch.py", "ncu.py", "paper.py", "spec.py"),
    "step_counters": ("kvlab/bench/stepcounters.py",),  # ncu on a decode step of kvlab.LLM
    "l2_ahead": ("kvlab/sim/ahead.py",),  # the cross-kernel prefetch in the L2 model
    "l2_model": _in("kvlab/sim", "__init__.py", "l2.py", "plan.py", "sample.py", "spec.py",
                    "time_model.py", "trace.py"),
    "predict": _in("kvlab/predict", "__init__.py", "closed_form.py", "decode.py", "fit.py",
                   "paper.py", "point.py", "recorded.py", "report.py", "validate.py"),
    "step_model": ("kvlab/predict/step.py",),  # a decode step kernel by kernel, modelled
    "ahead_model": ("kvlab/predict/ahead.py",),  # the cross-kernel prefetch, learned
    "dashboard": _in("kvlab/panels", "__init__.py", "app.py", "decode_kernels.py", "e2e.py",
                     "kvpr.py", "l2.py", "paged_cache.py", "widgets.py")
    + _in("kvlab/viz", "__init__.py", "cache.py", "counters.py", "e2e.py", "export.py",
          "kernels.py", "layout.py", "offload.py", "pinned.py", "regime.py", "timeline.py"),
    # The harnesses: what times and what is timed (events, L2 flush, steps warmed up in turn)
    "timing": ("kvlab/timing.py", "kvlab/bench/steps.py"),
    "cli": ("kvlab/bench/cli.py",),
    "bench_attention": ("kvlab/bench/attention.py",),
    "bench_counters": ("kvlab/bench/counters.py",),
    "bench_e2e": ("kvlab/bench/e2e.py",),
    "bench_kvpr": ("kvlab/bench/kvpr.py",),
    "bench_timeline": ("kvlab/bench/timeline.py",),
    "bench_cache": ("kvlab/bench/cache.py",),
    "bench_l2sim": ("kvlab/bench/l2sim.py",),
    "bench_steptrace": ("kvlab/bench/steptrace.py",),
}
# Files no recording's numbers depend on: what a recording records about itself, how recordings
# are read back (kvlab.results), the docs' statistics, a docstring
UNMEASURED = ("kvlab/components.py", "kvlab/results.py", "kvlab/bench/__init__.py",
              "kvlab/bench/env.py", "kvlab/bench/stats.py")

_DECODE = ("base", "cache", "decode_plan", "gqa", "vllm_v1", "green")
# benchmark (a result's "benchmark") -> the components it runs. NOTE: tests/test_components.py
# checks that each holds every kvlab module its harness imports, directly or not.
BENCHMARKS: dict[str, tuple[str, ...]] = {
    "attention": (*_DECODE, "vllm_own", "flashinfer", "read", "timing", "cli",
                  "bench_attention"),
    "counters": (*_DECODE, "profile", "timing", "cli", "bench_counters"),
    "timeline": (*_DECODE, "read", "tracer", "timing", "cli", "bench_timeline"),
    # (the +ahead variants' default size is the step model's: kvlab.bench.e2e.ahead_bytes)
    "e2e": (*_DECODE, "layer_ops", "model", "engine", "kvpr", "l2_model", "predict",
            "step_model", "timing", "cli", "bench_e2e"),
    "steptrace": (*_DECODE, "layer_ops", "model", "engine", "kvpr", "l2_model", "predict",
                  "step_model", "profile", "step_counters", "timing", "cli", "bench_e2e",
                  "bench_steptrace"),
    "kvpr": ("base", "cache", "decode_plan", "vllm_v1", "layer_ops", "model", "kvpr", "timing",
             "cli", "bench_kvpr"),
    "cache": ("base", "cache", "cli", "bench_cache"),
    "l2sim": ("base", "decode_plan", "l2_model", "cli", "bench_l2sim"),
    "l2_validation": ("base", "decode_plan", "l2_model"),
    "predict_fit": ("base", "decode_plan", "l2_model", "profile", "predict"),
    # (benchmarks/gemm_paths.py: the layer linears' shapes from the model's weights, timed)
    "gemm_paths": ("base", "model", "timing"),
    # the dashboard's tabs reach every benchmark (their run buttons) but those of other drivers
    "dashboard": tuple(c for c in COMPONENTS if c not in (
        "numba", "bench_cache", "bench_l2sim")),
}


def source_path(path: str) -> Path:
    """Where the file named `path` (from the repository's top level, e.g.
    "kernels/paged_decode_gqa.cu") is in this install: `kvlab/...` in the package, `kernels/...`
    in `kvlab/csrc/` where the wheel put it, anything else in the checkout."""
    top, _, rest = path.partition("/")
    if top == "kvlab":
        return PACKAGE_DIR / rest
    if top == "kernels" and PACKAGED_KERNELS.is_dir():
        return PACKAGED_KERNELS / rest
    return CHECKOUT_DIR / path


def digest(files: Iterable[tuple[str, bytes | None]]) -> str | None:
    """The version of a component from its files, `(path, bytes)` in the listed order: the first
    VERSION_HEX hex digits of their sha256; None if any file's bytes are None (absent)."""
    sha = hashlib.sha256()
    for path, data in files:
        if data is None:
            return None
        name = path.encode()
        sha.update(b"%d:%s%d:" % (len(name), name, len(data)))
        sha.update(data)
    return sha.hexdigest()[:VERSION_HEX]


def _read(path: str) -> bytes | None:
    try:
        return source_path(path).read_bytes()
    except FileNotFoundError:
        return None


def version(name: str) -> str | None:
    """The version of component `name` in the code installed now (None where one of its files
    is not here). Raises ValueError
    naming `name` and listing the components for a name not in COMPONENTS."""
    if name not in COMPONENTS:
        raise ValueError(f"name={name!r}: not a component; components: {list(COMPONENTS)}")
    return digest((path, _read(path)) for path in COMPONENTS[name])


@functools.cache
def versions() -> dict[str, str | None]:
    """Every component's version in the code installed now (computed once per process: the
    code this process imported), `{name: version}` in COMPONENTS' order."""
    return {name: version(name) for name in COMPONENTS}


def benchmark_components(benchmark: str) -> tuple[str, ...]:
    """The components benchmark `benchmark` runs, e.g. "attention". Raises ValueError naming
    `benchmark` and listing the benchmarks for one not in BENCHMARKS."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark={benchmark!r}: not a benchmark; benchmarks: "
                         f"{list(BENCHMARKS)}")
    return BENCHMARKS[benchmark]
