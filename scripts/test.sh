#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs the C++ tests (CTest) and the Python tests (pytest).
# With a GPU: every kernel for that GPU, and the GPU tests run. Without one (CI): the CI kernel subset compiled
# for all three arch families (sm_80, sm_90a, sm_120), and the GPU tests skip.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then mode=auto; else mode=ci; fi
dir="$(bash "$root/scripts/build.sh" "$mode" | tail -n1)"
export FLASHCUTE_LIBRARY="$dir/lib/libflashcute.so"
(cd "$dir" && ctest --output-on-failure -j "$(nproc)")
cd "$root"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q tests/python "$@"
