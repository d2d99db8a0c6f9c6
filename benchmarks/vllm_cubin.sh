#!/usr/bin/env bash
# Build vLLM's own PagedAttention v1/v2 kernels into a cubin for `python -m kvlab bench attention
# --vllm-cubin PATH` (kernel "vllm_own", timed in turn with vllm_v1 on the same cache).
# Usage: bash benchmarks/vllm_cubin.sh VLLM_SOURCE_DIR OUT.cubin [ARCH]
#   VLLM_SOURCE_DIR: an unpacked vLLM source tree that still has the kernels
#     (csrc/attention/attention_kernels.cuh), e.g. the sdist of vLLM 0.9.2 from PyPI (its link
#     on https://pypi.org/simple/vllm/; sha256
#     6b0d855ea8ba18d76364c9b82ea94bfcaa9c9e724055438b5733e4716ed104e1)
#   ARCH: nvcc's -arch (default sm_90). Needs nvcc; no GPU, no torch.
# kvlab ships none of vLLM's code: this only instantiates its templates (fp16, head_dim 128,
# blocks 8/16/32, 128 threads, 512-token partitions: kvlab/kernels/vllm_own.py) and compiles them
# with the flags vLLM's build gives nvcc (torch's, -DENABLE_FP8, -DNDEBUG, -O3). It writes
# OUT.cubin.json beside the cubin: vLLM's version, nvcc's, the flags (the benchmark records it).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash benchmarks/vllm_cubin.sh VLLM_SOURCE_DIR OUT.cubin [ARCH]" >&2
  exit 2
fi
src=$1 out=$2 arch=${3:-sm_90}
if [ ! -f "$src/csrc/attention/attention_kernels.cuh" ]; then
  echo "VLLM_SOURCE_DIR=$src: no csrc/attention/attention_kernels.cuh (a vLLM source tree" \
       "from before the kernels left it, such as the 0.9.2 sdist)" >&2
  exit 2
fi
command -v nvcc >/dev/null || { echo "nvcc not found" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the kernels include torch's headers for the launchers only: empty ones do for the kernels
mkdir -p "$work/torch" "$work/ATen/cuda" "$work/c10/cuda"
touch "$work/torch/all.h" "$work/ATen/cuda/CUDAContext.h" "$work/c10/cuda/CUDAGuard.h"
{
  echo '#include "attention/attention_kernels.cuh"'
  echo 'using vllm::Fp8KVCacheDataType;'
  for b in 8 16 32; do
    cat <<EOF
template __global__ void vllm::paged_attention_v1_kernel<uint16_t, uint16_t, 128, $b, 128,
    Fp8KVCacheDataType::kAuto, false>(uint16_t*, const uint16_t*, const uint16_t*,
    const uint16_t*, const int, const float, const int*, const int*, const int, const float*,
    const int, const int, const int, const float*, const float*, const int, const int, const int,
    const int, const int);
template __global__ void vllm::paged_attention_v2_kernel<uint16_t, uint16_t, 128, $b, 128,
    Fp8KVCacheDataType::kAuto, false, 512>(float*, float*, uint16_t*, const uint16_t*,
    const uint16_t*, const uint16_t*, const int, const float, const int*, const int*, const int,
    const float*, const int, const int, const int, const float*, const float*, const int,
    const int, const int, const int, const int);
EOF
  done
  echo 'template __global__ void vllm::paged_attention_v2_reduce_kernel<uint16_t, 128, 128, 512>('
  echo '    uint16_t*, const float*, const float*, const uint16_t*, const int*, const int);'
} > "$work/instances.cu"
flags=(-O3 -std=c++17 -DENABLE_FP8 -DNDEBUG -D__CUDA_NO_HALF_OPERATORS__
       -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
       -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr)
nvcc -arch="$arch" -cubin "${flags[@]}" -I "$work" -I "$src/csrc" -o "$out" "$work/instances.cu"
version=$(sed -n 's/^Version: //p' "$src/PKG-INFO" 2>/dev/null || true)
[ -n "$version" ] || version=$(git -C "$src" describe --tags --always 2>/dev/null || echo unknown)
VLLM_VERSION=$version NVCC=$(nvcc --version | sed -n "s/.*release //p") ARCH=$arch FLAGS="${flags[*]}" python3 - "$out" <<'EOF'
import json, os, sys
notes = {"vllm": os.environ["VLLM_VERSION"], "nvcc": os.environ["NVCC"],
         "arch": os.environ["ARCH"], "flags": os.environ["FLAGS"]}
with open(sys.argv[1] + ".json", "w") as f:
    json.dump(notes, f, indent=2)
    f.write("\n")
EOF
echo "wrote $out and $out.json (vLLM $version)"
