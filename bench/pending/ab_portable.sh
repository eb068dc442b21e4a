#!/usr/bin/env bash
# Device side of patch 0004 (the portable backward with V in registers: the 99 KB candidates hd256 64 x 32 w8vr and
# hd128 64 x 64 w8vr; #14), in one call, results under $OUT:
#   with a library that has the patch's kernels (a full build of a tree with 0004 applied, e.g. scripts/prebuild.sh):
#            FLASHCUTE_LIBRARY=.prebuilt/lib/libflashcute.so bash bench/pending/ab_portable.sh
#   without: here  bash scripts/ab_tree.sh pack HEAD vregs bench/pending/0004-*.patch   (vregs.tar)
#            device  bash bench/pending/ab_portable.sh    (carry .peers/third_party.tar.xz; builds the hd128/hd256 set)
# First times each candidate beside the shipped 99 KB tile (dispatch's choice) and FA2 under FLASHCUTE_ARCH=86 and
# =120, default and deterministic backward, in one process; then runs the GPU grid's backward cases of its head dim
# with the candidate forced (FLASHCUTE_CONFIG, per dtype; natively and under the emulated profiles, deterministic
# bits included).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/flashcute-out}"
cd "$root"
t0=$(date +%s)
tree="$root"
if [ -z "${FLASHCUTE_LIBRARY:-}" ]; then
  kernels='(sm80_bwd_(bf16|fp16)_hd(128|256)_.*|sm80_fwd_(bf16|fp16)_hd(128|256)_.*|sm90_fwd_(bf16|fp16)_hd(128|256)_.*)$'
  [ -d third_party/cutlass ] || tar -C . -xJf .peers/third_party.tar.xz
  FLASHCUTE_LIBRARY="$(timeout 300 bash scripts/ab_tree.sh build "$kernels" vregs | tail -n1)"
  cp /tmp/vregs/build.txt "$out/build-vregs.txt" 2>/dev/null
  grep -A2 "w8vr" "$out/build-vregs.txt" | grep -E "spill|Used" > "$out/spills.txt"
  tree=/tmp/vregs
  echo "build: $FLASHCUTE_LIBRARY ($(( $(date +%s) - t0 )) s)"
fi
export FLASHCUTE_LIBRARY PYTHONPATH="$tree/python" PYTHONUNBUFFERED=1
timeout "${BENCH_TIMEOUT:-240}" python3 bench/run.py --mode bwd --impl flash,flashcute,flashcute-det --arch 86,120 \
  --config sm80_bwd_bf16_hd256_m64n32w8vr,sm80_bwd_bf16_hd128_m64n64w8vr --dtype bf16 --hdim 128,256 \
  --seqlen 1k,4k,16k --causal 0,1 --target-s "${TARGET_S:-0.05}" --no-plots --no-ceilings --out "$out/bench" \
  > "$out/bench.txt" 2>&1
echo "bench: exit $? ($(( $(date +%s) - t0 )) s)"
tail -n 60 "$out/bench.txt"
# test_backward_grid_forced_arch runs fp16 under 80 / 86 / 120 and bf16 under 89; test_backward_deterministic_bits'
# cases are numbered (dtypeN) in their list's order.
grid_cases() {  # head_dim dtype forced-arch-ids deterministic-ids
  local tile k
  tile=$([ "$1" = 256 ] && echo m64n32w8vr || echo m64n64w8vr)
  k="(test_backward_grid and $2-$1-) or (test_backward_grid_forced_arch and ($3))"
  [ -n "$4" ] && k="$k or (deterministic_bits and ($4))"
  FLASHCUTE_CONFIG="sm80_bwd_$2_hd$1_$tile" timeout "${TEST_TIMEOUT:-90}" python3 -m pytest -q -x \
    -p no:cacheprovider "$tree/tests/python/test_gpu_grid.py" -k "$k" > "$out/pytest-$2-$1.txt" 2>&1
  echo "pytest $2 hd$1 ($k): exit $? ($(( $(date +%s) - t0 )) s): $(tail -n1 "$out/pytest-$2-$1.txt")"
}
grid_cases 256 fp16 "80-256- or 86-256- or 120-256-" "dtype3 or dtype6"
grid_cases 256 bf16 "89-256-" "dtype8"
grid_cases 128 bf16 "89-128-" "dtype0 or dtype1 or dtype4"
grid_cases 128 fp16 "80-128- or 86-128- or 120-128-" ""
