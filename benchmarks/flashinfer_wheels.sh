#!/usr/bin/env bash
# Fetch FlashInfer's wheel (flashinfer-python, the version kvlab/kernels/flashinfer_peer.py pins)
# and the wheels its decode needs that the device image lacks into .whl-flashinfer/, for `bench
# attention --kernels flashinfer flashinfer_tc`: device_run.sh installs .whl-flashinfer/*.whl there
# (no index, no deps).
# Usage, on a machine with PyPI, from the repo root:
#   [DEVICE_PYTHON=3.12] [PLATFORM=manylinux_2_28_x86_64] \
#     bash benchmarks/flashinfer_wheels.sh [DEST]
#   DEST: default .whl-flashinfer (ignored by git). DEVICE_PYTHON: the device image's python3 (X.Y).
# The wheel is slimmed to fit the device tool's 64 MiB carry with the tree: the CUDA sources of
# FlashInfer's other kernel families (flashinfer/data/csrc/*/: MoE, MLA, GEMM, ...; and those
# beside the experimental package's modules) are left out: the decode JIT needs only data/csrc's
# top-level files, data/include, cutlass, cccl and spdlog. It prints, and writes to
# DEST/flashinfer.txt, the version and every wheel's sha256 (the run's log keeps them).
# NOTE: flashinfer-python compiles its kernels with nvcc on first use (JIT, cached under
# ~/.cache/flashinfer): the first device call pays for it, a fresh machine pays again.
set -euo pipefail
dest=${1:-.whl-flashinfer}
pyver=${DEVICE_PYTHON:-3.12} platform=${PLATFORM:-manylinux_2_28_x86_64}
version=$(sed -n 's/^FLASHINFER_VERSION = "\([^"]*\)".*/\1/p' kvlab/kernels/flashinfer_peer.py)
[ -n "$version" ] || { echo "FLASHINFER_VERSION not found in kvlab/kernels/flashinfer_peer.py" >&2
                       exit 2; }
# What `import flashinfer` needs that the image (torch, numpy, transformers and theirs) lacks;
# its other requirements (cuda-python, cutlass-dsl, cudnn-frontend, nccl4py, ...) serve kernels
# kvlab does not run, and flashinfer imports without them.
# Pinned to the versions the recordings ran with (within flashinfer's own constraints).
deps=(apache-tvm-ffi==0.1.15.post2 click==8.5.1 einops==0.8.2 ninja==1.13.2
      nvidia-ml-py==13.615.71 tabulate==0.10.0)
mkdir -p "$dest"
get() {  # one requirement, its own wheel only, for the device's python and platform
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --platform "$platform" --platform manylinux2014_x86_64 --platform any --dest "$dest" "$1"
}
get "flashinfer-python==$version"
for dep in "${deps[@]}"; do get "$dep"; done
python3 - "$dest"/flashinfer_python-"$version"-*.whl <<'PYEOF'
import os, re, sys, zipfile
path = sys.argv[1]
dropped = re.compile(r"flashinfer/(data/csrc/[^/]+/|experimental/.*\.(cu|cuh|c|h)$)")
slim = path + ".slim"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        if dropped.match(info.filename):
            continue
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):  # list only the files kept
            data = b"".join(line for line in data.splitlines(keepends=True)
                            if not dropped.match(line.decode().split(",")[0]))
        dst.writestr(info, data)
os.replace(slim, path)
PYEOF
{
  echo "flashinfer-python $version (slimmed: decode sources only) for python $pyver on $platform"
  (cd "$dest" && sha256sum ./*.whl)
} | tee "$dest/flashinfer.txt"
