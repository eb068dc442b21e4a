#!/usr/bin/env bash
# One device call for bench/pending (README.md there): DIR (default build/pending) holds prebuilt_main.tar.xz and
# prebuilt_dod.tar.xz (scripts/prebuild.sh output of main and of main + 0001) and v1-v4.so.xz (subset libraries of
# main + 0002, + 0002-0003, + 0004, + 0002-0004). Run on the device as `DEADLINE=<s> bash bench/pending/ab.sh DIR`: the
# dO A/B first, then the whole suite on the 0001 library (or its backward grid where time is short), the 192-row
# A/B, the sanitizers, the portable tiles per profile beside FA2.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-build/pending}
export OUT=${OUT:-/tmp/out}
t0=$(date +%s)
room() { [ $(( $(date +%s) - t0 + $1 )) -lt ${DEADLINE:-588} ]; }
mkdir -p /tmp/m && tar -C /tmp/m -xJf $DIR/prebuilt_main.tar.xz && rm -rf .prebuilt_dod && tar -xJf $DIR/prebuilt_dod.tar.xz
MAIN=/tmp/m/.prebuilt/lib/libflashcute.so DOD=$PWD/.prebuilt_dod/lib/libflashcute.so
for f in $DIR/*.so.xz; do xz -dkf "$f"; done
export LD_LIBRARY_PATH=/tmp/m/.prebuilt/lib FLASHCUTE_LIBRARY=$MAIN PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
cp $MAIN /tmp/main2.so
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout -s INT -k 15 150 python3 bench/run.py --mode bwd --impl flashcute --arch 80,86 --lib dod=$DOD \
  --lib main2=/tmp/main2.so --dtype bf16 --hdim 64,128,192 --seqlen 1k,4k,16k --causal 0,1 --rounds 4 --target-s 0.08 \
  --no-plots --no-ceilings --out $OUT/ab2 > $OUT/ab2.txt 2>&1
echo "ab bwd: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/ab2.txt | head -45
if room 260; then PREBUILT=.prebuilt_dod PYTEST_TIMEOUT=200 TEST_TIMEOUT=100 bash scripts/gpu_session.sh > $OUT/session.txt 2>&1
elif room 100; then (export LD_LIBRARY_PATH=$PWD/.prebuilt_dod/lib FLASHCUTE_LIBRARY=$DOD
  timeout 90 python3 -m pytest -q --no-header -p no:cacheprovider tests/python/test_gpu_grid.py \
   -k "backward_grid_forced_arch or deterministic_bits" > $OUT/session.txt 2>&1); fi
echo "session (dod) at $(( $(date +%s) - t0 )) s"; tail -n 25 $OUT/session.txt
room 150 && timeout -s INT -k 15 140 python3 bench/run.py --mode fwd --impl flashcute --lib v1=$DIR/v1.so --lib v2=$DIR/v2.so \
  --lib v3=$DIR/v3.so --lib v4=$DIR/v4.so --lib main2=/tmp/main2.so --dtype bf16 --hdim 64 --seqlen 2k,4k,8k,16k \
  --causal 0,1 --rounds 5 --target-s 0.1 \
  --no-plots --no-ceilings --out $OUT/ab > $OUT/ab.txt 2>&1
echo "ab fwd: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/ab.txt | head -30
export LD_LIBRARY_PATH=$PWD/.prebuilt_dod/lib FLASHCUTE_LIBRARY=$DOD
for arch in 80 86; do for tool in racecheck memcheck; do
  room 45 && FLASHCUTE_ARCH=$arch timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_bwd.py 64,128 > $OUT/san-bwd-$arch-$tool.txt 2>&1
  echo "sanitize_bwd arch $arch $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-bwd-$arch-$tool.txt | tail -n1) at $(( $(date +%s) - t0 )) s"
done; done
for tool in racecheck synccheck memcheck; do
  room 45 && FLASHCUTE_FWD_GRID=2 timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_fwd.py > $OUT/san-fwd-$tool.txt 2>&1
  echo "sanitize_fwd $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-fwd-$tool.txt | tail -n1) at $(( $(date +%s) - t0 )) s"
done
export LD_LIBRARY_PATH=/tmp/m/.prebuilt/lib FLASHCUTE_LIBRARY=$MAIN
left=$(( ${DEADLINE:-588} - ($(date +%s) - t0) ))
[ $left -gt 60 ] && timeout -s INT -k 15 $left python3 bench/run.py --mode fwd,bwd --impl flash,flashcute --arch 80,86 --dtype bf16 \
  --hdim 64,128,256 --seqlen 1k,4k,16k --causal 0,1 --target-s 0.08 --rounds 2 --no-plots --no-ceilings \
  --out $OUT/portable > $OUT/portable.txt 2>&1
echo "portable: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/portable.txt | head -50
