#!/usr/bin/env bash
# Device side of an A/B of the Hopper backward patches in this folder against the working tree, in one call:
#   here:    for each variant, bash scripts/ab_tree.sh pack HEAD NAME bench/pending/PATCH...   (NAME.tar)
#   device:  bash bench/pending/ab_bwd.sh NAME...      (carry .peers/third_party.tar.xz; results under $OUT)
# Builds the working tree and each NAME.tar for KERNELS (default the bf16 hd64 and hd128 backward, and the forward
# tiles dispatch picks there: the backward bench and tests run the forward first), one tree after another (each
# with every core), then runs the GPU grid's native bf16 hd64 / hd128 backward cases on each variant (the
# deterministic-bits ones included) and times the default and the deterministic backward of all of them in one
# process; bench/run.py checks each result against PyTorch as it times it. ptxas spills per tree go to $OUT.
# PREBUILT=DIR: no builds; DIR/head/libflashcute.so and DIR/NAME/libflashcute.so, built elsewhere for sm_90a with
# the same KERNELS (scripts/ab_tree.sh build does it on any machine with nvcc; this one's CPU is not needed).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/flashcute-out}"
kernels="${KERNELS:-sm90_bwd_bf16_hd(64|128)_.*|sm90_fwd_bf16_hd(64_m192n128w12|64_m128n128w8|128_m128n128w8|128_m64n128w4)\$}"
cd "$root"
t0=$(date +%s)
if [ -n "${PREBUILT:-}" ]; then
  head="$root/$PREBUILT/head/libflashcute.so"
else
  [ -d third_party/cutlass ] || tar -C . -xJf .peers/third_party.tar.xz
  dir="$(timeout 300 bash scripts/build.sh auto -DFLASHCUTE_KERNELS="$kernels" -DFLASHCUTE_BUILD_TESTS=OFF 2> "$out/build-head.txt" | tail -n1)"
  head="$dir/lib/libflashcute.so"
fi
echo "head: $head ($(( $(date +%s) - t0 )) s)"
libs=()
for name in "$@"; do
  if [ -n "${PREBUILT:-}" ]; then
    lib="$root/$PREBUILT/$name/libflashcute.so"
  else
    lib="$(timeout 300 bash scripts/ab_tree.sh build "$kernels" "$name" | tail -n1)"
    cp "/tmp/$name/build.txt" "$out/build-$name.txt" 2>/dev/null
  fi
  echo "$name: $lib ($(( $(date +%s) - t0 )) s)"
  libs+=(--lib "$name=$lib")
done
grep -H "spill stores" "$out"/build-*.txt 2>/dev/null |
  sed -E 's/ptxas warning : Registers are spilled to local memory in function//' > "$out/spills.txt"
export PYTHONPATH="$root/python" PYTHONUNBUFFERED=1
for name in "$@"; do
  lib="/tmp/$name/build/lib/libflashcute.so"
  [ -n "${PREBUILT:-}" ] && lib="$root/$PREBUILT/$name/libflashcute.so"
  # Native bf16 hd64 / hd128: the whole backward grid and test_backward_deterministic_bits' bf16 hd128 cases.
  FLASHCUTE_LIBRARY="$lib" timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q -x -p no:cacheprovider \
    tests/python/test_gpu_grid.py -k "(test_backward_grid and (bf16-64- or bf16-128-)) or (deterministic_bits and (dtype0 or dtype1))" \
    > "$out/pytest-$name.txt" 2>&1
  echo "pytest $name: exit $? ($(( $(date +%s) - t0 )) s): $(tail -n1 "$out/pytest-$name.txt")"
done
export FLASHCUTE_LIBRARY="$head"
timeout "${BENCH_TIMEOUT:-300}" python3 bench/run.py --mode bwd --impl flashcute,flashcute-det "${libs[@]}" \
  --dtype bf16 --hdim "${HDIM:-64,128}" --seqlen 1k,4k,16k --causal 0,1 --target-s "${TARGET_S:-0.05}" \
  --no-plots --no-ceilings --out "$out/bench" > "$out/bench.txt" 2>&1
echo "bench: exit $? ($(( $(date +%s) - t0 )) s)"
tail -n 40 "$out/bench.txt"
