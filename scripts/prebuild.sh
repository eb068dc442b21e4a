#!/usr/bin/env bash
# Builds the sm_90a library and the C++ test binaries on this machine (no GPU needed) and copies them into
# .prebuilt/ (git-ignored), so that a session on a lent H200 spends its time testing, not compiling:
# run(command='PREBUILT=.prebuilt bash scripts/gpu_session.sh', carry=['.prebuilt']). gpu_session.sh builds there
# after all when these binaries do not run on that machine. Extra CMake options may follow. Also writes
# .prebuilt.tar.xz (every kernel: about 6 MB against 62 unpacked, under the 64 MB a device call carries); carry that
# instead and gpu_session.sh unpacks it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/build/sm90a"
cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DFLASHCUTE_CUDA_ARCHS=90a -DFLASHCUTE_PTX_ARCH= \
  -DFLASHCUTE_KERNELS="${KERNELS:-all}" "$@" > /dev/null
cmake --build "$dir" -j "$(nproc)" 2>&1 | tee "$dir/build.log" | { grep -i -E 'warning|error|spill' >&2 || true; }
rm -rf "$root/.prebuilt"
mkdir -p "$root/.prebuilt/lib" "$root/.prebuilt/tests/cpp"
cp "$dir/lib/libflashcute.so" "$root/.prebuilt/lib/"
find "$dir/tests/cpp" -maxdepth 1 -name 'test_*' -type f -executable -exec cp {} "$root/.prebuilt/tests/cpp/" \;
tar -C "$root" -cf - .prebuilt | xz -3 -T0 > "$root/.prebuilt.tar.xz"
du -sh "$root/.prebuilt" "$root/.prebuilt.tar.xz"
