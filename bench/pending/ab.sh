#!/usr/bin/env bash
# One device call for bench/pending (README.md there): DIR (default build/pending) holds prebuilt_main.tar.xz and
# prebuilt_cand.tar.xz (scripts/prebuild.sh output of main and of main + the candidate, the second packed with its
# top folder renamed .prebuilt_cand). Run on the device as `DEADLINE=<s> bash bench/pending/ab.sh DIR`: the Hopper
# backward A/B (default and deterministic) against main and a copy of it, the whole suite on the candidate's
# library, compute-sanitizer on the Hopper backward.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-build/pending}
export OUT=${OUT:-/tmp/out}
t0=$(date +%s)
room() { [ $(( $(date +%s) - t0 + $1 )) -lt ${DEADLINE:-588} ]; }
mkdir -p /tmp/m && tar -C /tmp/m -xJf $DIR/prebuilt_main.tar.xz && rm -rf .prebuilt_cand && tar -xJf $DIR/prebuilt_cand.tar.xz
MAIN=/tmp/m/.prebuilt/lib/libflashcute.so CAND=$PWD/.prebuilt_cand/lib/libflashcute.so
export LD_LIBRARY_PATH=/tmp/m/.prebuilt/lib FLASHCUTE_LIBRARY=$MAIN PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
cp $MAIN /tmp/main2.so
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout -s INT -k 15 170 python3 bench/run.py --mode bwd --impl flashcute,flashcute-det --lib cand=$CAND \
  --lib main2=/tmp/main2.so --dtype bf16 --hdim 64,128,192,256 --seqlen 1k,4k,16k --causal 0,1 --rounds 4 \
  --target-s 0.06 --no-plots --no-ceilings --out $OUT/ab > $OUT/ab.txt 2>&1
echo "ab bwd: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/ab.txt | head -60
if room 260; then PREBUILT=.prebuilt_cand PYTEST_TIMEOUT=200 TEST_TIMEOUT=100 bash scripts/gpu_session.sh > $OUT/session.txt 2>&1
elif room 100; then (export LD_LIBRARY_PATH=$PWD/.prebuilt_cand/lib FLASHCUTE_LIBRARY=$CAND
  timeout 90 python3 -m pytest -q --no-header -p no:cacheprovider tests/python/test_gpu_grid.py \
   -k "backward" > $OUT/session.txt 2>&1); fi
echo "session (cand) at $(( $(date +%s) - t0 )) s"; tail -n 25 $OUT/session.txt
export LD_LIBRARY_PATH=$PWD/.prebuilt_cand/lib FLASHCUTE_LIBRARY=$CAND
for tool in racecheck synccheck memcheck; do
  room 60 && timeout 55 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_bwd.py > $OUT/san-bwd-$tool.txt 2>&1
  echo "sanitize_bwd $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-bwd-$tool.txt | tail -n1) at $(( $(date +%s) - t0 )) s"
done
