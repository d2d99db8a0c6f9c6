#!/usr/bin/env bash
# Fetch FlashInfer's wheel (flashinfer-python, the version kvlab/kernels/flashinfer_peer.py pins)
# and the wheels it needs that the device image lacks into .whl/, for `bench attention --kernels
# flashinfer flashinfer_tc`: device_run.sh installs .whl/*.whl there (no index, no deps).
# Usage, on a machine with PyPI, from the repo root:
#   [DEVICE_PYTHON=3.12] [PLATFORM=manylinux_2_28_x86_64] bash benchmarks/flashinfer_wheels.sh [DEST]
#   DEST: default .whl (ignored by git). DEVICE_PYTHON: the device image's python3 (X.Y).
# Leaves out torch and the nvidia-*/cuda-* wheels (the device image has them). It prints, and
# writes to DEST/flashinfer.txt, the version and every wheel's sha256 (the run's log keeps them).
# NOTE: flashinfer-python compiles its kernels with nvcc on first use (JIT, cached under
# ~/.cache/flashinfer): the first device call pays for it, a fresh machine pays again.
set -euo pipefail
dest=${1:-.whl}
pyver=${DEVICE_PYTHON:-3.12} platform=${PLATFORM:-manylinux_2_28_x86_64}
version=$(sed -n 's/^FLASHINFER_VERSION = "\([^"]*\)".*/\1/p' kvlab/kernels/flashinfer_peer.py)
[ -n "$version" ] || { echo "FLASHINFER_VERSION not found in kvlab/kernels/flashinfer_peer.py" >&2
                       exit 2; }
mkdir -p "$dest"
get() {  # one requirement, its own wheel only, for the device's python and platform
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --platform "$platform" --platform manylinux2014_x86_64 --platform any --dest "$dest" "$1"
}
get "flashinfer-python==$version"
wheel=$(ls "$dest"/flashinfer_python-"$version"-*.whl)
# its requirements (Requires-Dist without extras or markers that exclude Linux), less the image's
python3 - "$wheel" <<'EOF' > "$dest/.requires"
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    lines = whl.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req, _, marker = line.split(":", 1)[1].strip().partition(";")
    name = re.split(r"[ <>=!~\[(]", req.strip(), maxsplit=1)[0].lower()
    if "extra ==" in marker or "sys_platform == \"win32\"" in marker:
        continue
    if name == "torch" or name.startswith(("nvidia-", "cuda-")):
        continue
    print(req.strip())
EOF
while read -r req; do get "$req"; done < "$dest/.requires"
rm -f "$dest/.requires"
{
  echo "flashinfer-python $version for python $pyver on $platform"
  (cd "$dest" && sha256sum ./*.whl)
} | tee "$dest/flashinfer.txt"
