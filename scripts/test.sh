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
# Packaging: the CMake package (cmake --install, find_package(flashcute)) with the C example linked against it, and
# `pip install .` offline (--no-build-isolation; the kernels are left out, the packaging is what is tested here).
pkg="$(mktemp -d)"
trap 'rm -rf "$pkg"' EXIT
cmake --install "$dir" --prefix "$pkg/install" > /dev/null
cmake -S "$root/examples/c_api" -B "$pkg/example" -DCMAKE_PREFIX_PATH="$pkg/install" > /dev/null
cmake --build "$pkg/example" > /dev/null
"$pkg/example/flashcute_c_example"
FLASHCUTE_KERNELS=none python3 -m pip install --quiet --no-build-isolation --no-deps --target "$pkg/site" "$root" \
  2> >(grep -v "Running pip as the 'root' user" >&2)
(cd "$pkg" && env -u FLASHCUTE_LIBRARY PYTHONPATH="$pkg/site" python3 -c "from flashcute import _capi
path = _capi.library_path()
assert path and path.startswith('$pkg/site/'), f'the installed package loads {path}'
print('pip-installed package:', path, '|', _capi.build_info())")
cd "$root"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q tests/python "$@"
