#!/usr/bin/env bash
# Device side of an A/B of the Hopper backward patches in this folder against the working tree, in one call:
#   here:    for each variant, bash scripts/ab_tree.sh pack HEAD NAME bench/pending/PATCH...   (NAME.tar)
#   device:  bash bench/pending/ab_bwd.sh NAME...      (carry .peers/third_party.tar.xz; results under $OUT)
# Builds the working tree and each NAME.tar for KERNELS (default the bf16 hd64 and hd128 backward), one tree after
# another (each with every core), then times the default and the deterministic backward of all of them in one
# process; bench/run.py checks each result against PyTorch as it times it. ptxas spills per tree go to $OUT.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/flashcute-out}"
kernels="${KERNELS:-sm90_bwd_bf16_hd(64|128)_.*}"
cd "$root"
[ -d third_party/cutlass ] || tar -C . -xJf .peers/third_party.tar.xz
t0=$(date +%s)
dir="$(timeout 300 bash scripts/build.sh auto -DFLASHCUTE_KERNELS="$kernels" -DFLASHCUTE_BUILD_TESTS=OFF 2> "$out/build-head.txt" | tail -n1)"
echo "head: $dir ($(( $(date +%s) - t0 )) s)"
libs=()
for name in "$@"; do
  lib="$(timeout 300 bash scripts/ab_tree.sh build "$kernels" "$name" | tail -n1)"
  cp "/tmp/$name/build.txt" "$out/build-$name.txt" 2>/dev/null
  echo "$name: $lib ($(( $(date +%s) - t0 )) s)"
  libs+=(--lib "$name=$lib")
done
grep -H "spill stores" "$out"/build-*.txt | sed -E 's/ptxas warning : Registers are spilled to local memory in function//' > "$out/spills.txt"
export FLASHCUTE_LIBRARY="$dir/lib/libflashcute.so" PYTHONPATH="$root/python" PYTHONUNBUFFERED=1
timeout "${BENCH_TIMEOUT:-300}" python3 bench/run.py --mode bwd --impl flashcute,flashcute-det "${libs[@]}" \
  --dtype bf16 --hdim "${HDIM:-64,128}" --seqlen 1k,4k,16k --causal 0,1 --target-s "${TARGET_S:-0.05}" \
  --no-plots --no-ceilings --out "$out/bench" > "$out/bench.txt" 2>&1
echo "bench: exit $? ($(( $(date +%s) - t0 )) s)"
tail -n 40 "$out/bench.txt"
