#!/usr/bin/env bash
# Configures and builds flashcute. Usage: scripts/build.sh [auto|ci|all]
#   auto (default): only the GPU found here (all kernels for its arch); with no GPU, the host library and
#                   reference only (no kernels), which is all a CPU-only machine can run.
#   ci:             the CI kernel subset for all three arch families (sm_80, sm_90a, sm_120 + compute_80 PTX).
#   all:            every kernel for sm_80, sm_90a and sm_120 + compute_80 PTX (the release build).
# Prints the build directory on its last line. Extra CMake options may follow the mode.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-auto}"
shift || true
gpu_arch() {
  command -v nvidia-smi >/dev/null || return 0
  local cc
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')" || return 0
  case "$cc" in
    "") ;;
    90) echo 90a ;;
    *) echo "$cc" ;;
  esac
}
case "$mode" in
  auto)
    arch="$(gpu_arch)"
    if [ -n "$arch" ]; then
      opts=(-DFLASHCUTE_CUDA_ARCHS="$arch" -DFLASHCUTE_PTX_ARCH= -DFLASHCUTE_KERNELS=all)
      dir="$root/build/sm$arch"
    else
      echo "flashcute build: no NVIDIA GPU found; building the host library and the float64 reference only" >&2
      opts=(-DFLASHCUTE_CUDA_ARCHS=80 -DFLASHCUTE_PTX_ARCH= -DFLASHCUTE_KERNELS=none)
      dir="$root/build/host"
    fi ;;
  ci) opts=(-DFLASHCUTE_CUDA_ARCHS="80;90a;120" -DFLASHCUTE_PTX_ARCH=80 -DFLASHCUTE_KERNELS=ci); dir="$root/build/ci" ;;
  all) opts=(-DFLASHCUTE_CUDA_ARCHS="80;90a;120" -DFLASHCUTE_PTX_ARCH=80 -DFLASHCUTE_KERNELS=all); dir="$root/build/all" ;;
  *) echo "usage: scripts/build.sh [auto|ci|all] [cmake options]" >&2; exit 2 ;;
esac
jobs="$(nproc)"
start=$(date +%s)
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release "${opts[@]}" "$@" >/dev/null
# Full log in build.log; shown here: per-kernel compile times, warnings (ptxas spills) and errors.
cmake --build "$dir" -j "$jobs" 2>&1 | tee "$dir/build.log" |
  { grep --line-buffered -i -E 'compile-time|warning|error|spill' >&2 || true; }
echo "flashcute build: $mode in $(( $(date +%s) - start )) s ($jobs jobs)" >&2
echo "$dir"
