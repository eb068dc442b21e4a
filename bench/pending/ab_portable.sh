#!/usr/bin/env bash
# Device side of patch 0004 (the portable hd256 64 x 32 backward tile, V in registers; #14), in one call:
#   here:    bash scripts/ab_tree.sh pack HEAD vregs bench/pending/0004-*.patch            (vregs.tar)
#   device:  bash bench/pending/ab_portable.sh      (carry .peers/third_party.tar.xz; results under $OUT)
# Builds the patched tree's hd256 kernels (the backward tiles and the forwards the tests need), runs the GPU grid's
# hd256 backward cases with the candidate forced (FLASHCUTE_CONFIG, per dtype; natively and under the emulated
# profiles), then times it beside the shipped 99 KB tile (32 x 32 w4) and FA2 under FLASHCUTE_ARCH=86 and =120,
# default and deterministic backward, in one process.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/flashcute-out}"
kernels='(sm80_bwd_(bf16|fp16)_hd256_.*|sm80_fwd_(bf16|fp16)_hd256_.*|sm90_fwd_(bf16|fp16)_hd256_.*)$'
cd "$root"
[ -d third_party/cutlass ] || tar -C . -xJf .peers/third_party.tar.xz
t0=$(date +%s)
lib="$(timeout 300 bash scripts/ab_tree.sh build "$kernels" vregs | tail -n1)"
cp /tmp/vregs/build.txt "$out/build-vregs.txt" 2>/dev/null
grep -A2 "m64n32w8" "$out/build-vregs.txt" | grep -E "spill|Used" > "$out/spills.txt"
echo "build: $lib ($(( $(date +%s) - t0 )) s)"
export FLASHCUTE_LIBRARY="$lib" PYTHONPATH=/tmp/vregs/python PYTHONUNBUFFERED=1
grid=/tmp/vregs/tests/python/test_gpu_grid.py
for dt in bf16 fp16; do
  # test_backward_grid_forced_arch takes fp16 under 80 / 86 / 120 and bf16 under 89.
  forced=$([ $dt = fp16 ] && echo "not 89" || echo "89")
  FLASHCUTE_CONFIG=sm80_bwd_${dt}_hd256_m64n32w8 timeout 240 python3 -m pytest -q -p no:cacheprovider "$grid" \
    -k "(test_backward_grid and $dt and 256) or (test_backward_grid_forced_arch and 256 and $forced) or (deterministic_bits and 256 and $dt)" \
    > "$out/pytest-$dt.txt" 2>&1
  echo "pytest $dt: exit $? ($(( $(date +%s) - t0 )) s): $(tail -n1 "$out/pytest-$dt.txt")"
done
timeout "${BENCH_TIMEOUT:-240}" python3 bench/run.py --mode bwd --impl flash,flashcute,flashcute-det --arch 86,120 \
  --config sm80_bwd_bf16_hd256_m64n32w8 --dtype bf16 --hdim 256 \
  --seqlen 1k,4k,16k --causal 0,1 --target-s "${TARGET_S:-0.05}" --no-plots --no-ceilings --out "$out/bench" \
  > "$out/bench.txt" 2>&1
echo "bench: exit $? ($(( $(date +%s) - t0 )) s)"
tail -n 40 "$out/bench.txt"
