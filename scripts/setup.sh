#!/usr/bin/env bash
# Installs what flashcute's build, tests and demo need, once: CuTe headers (into third_party/), and the Python
# packages that are missing. PyTorch from PyPI is a multi-GB CUDA build: it is installed only when absent.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/install_cutlass.sh"
missing=()
python3 -c "import numpy" 2>/dev/null || missing+=(numpy)
python3 -c "import pytest" 2>/dev/null || missing+=(pytest)
python3 -c "import matplotlib" 2>/dev/null || missing+=(matplotlib)
python3 -c "import torch" 2>/dev/null || missing+=("torch>=2.4")
python3 -c "import scikit_build_core" 2>/dev/null || missing+=("scikit-build-core>=0.10")
if [ ${#missing[@]} -gt 0 ]; then
  echo "flashcute setup: installing ${missing[*]} (torch is several GB; once per machine)"
  python3 -m pip install --quiet "${missing[@]}"
fi
for tool in cmake nvcc; do
  command -v "$tool" >/dev/null || { echo "flashcute setup: '$tool' not found on PATH (needs CMake and CUDA 13 nvcc)" >&2; exit 1; }
done
