#!/usr/bin/env bash
# One device call for bench/pending (README.md there): DIR (default build/pending) holds prebuilt_main.tar.xz (main's
# whole sm_90a library, scripts/prebuild.sh output) and cand.so.xz (the candidate's subset library: the hd64 Hopper
# backward and the forward tile its tests call) and, optionally, prebuilt_cand.tar.xz (the candidate's whole library,
# its top folder renamed .prebuilt_cand). Run on the device as `DEADLINE=<s> bash bench/pending/ab.sh DIR`: the hd64
# Hopper backward A/B (default and deterministic) against main and a copy of it, the whole suite on the candidate's
# whole library (or, without it, the hd64 backward tests on the subset) and compute-sanitizer on the candidate.
set -uo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-build/pending}
export OUT=${OUT:-/tmp/out}
t0=$(date +%s)
room() { [ $(( $(date +%s) - t0 + $1 )) -lt ${DEADLINE:-588} ]; }
mkdir -p /tmp/m /tmp/c && tar -C /tmp/m -xJf $DIR/prebuilt_main.tar.xz && xz -dc $DIR/cand.so.xz > /tmp/c/libflashcute.so
MAIN=/tmp/m/.prebuilt/lib/libflashcute.so CAND=/tmp/c/libflashcute.so
export FLASHCUTE_LIBRARY=$MAIN PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
cp $MAIN /tmp/main2.so
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
# A short call: IMPLS=flashcute SEQLENS=4k,16k ROUNDS=4.
timeout -s INT -k 15 200 python3 bench/run.py --mode bwd --impl ${IMPLS:-flashcute,flashcute-det} --lib cand=$CAND \
  --lib main2=/tmp/main2.so --dtype bf16 --hdim 64 --seqlen ${SEQLENS:-1k,2k,4k,8k,16k} --causal 0,1 --rounds ${ROUNDS:-6} \
  --target-s 0.06 --no-plots --no-ceilings --out $OUT/ab > $OUT/ab.txt 2>&1
echo "ab bwd: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/ab.txt | head -30
if [ -f $DIR/prebuilt_cand.tar.xz ] && room 260; then
  # The whole suite on the candidate's whole library (scripts/prebuild.sh output, its top folder .prebuilt_cand).
  rm -rf .prebuilt_cand && tar -xJf $DIR/prebuilt_cand.tar.xz
  PREBUILT=.prebuilt_cand PYTEST_TIMEOUT=200 TEST_TIMEOUT=100 bash scripts/gpu_session.sh > $OUT/session.txt 2>&1
  echo "session (cand, whole library) at $(( $(date +%s) - t0 )) s"; tail -n 12 $OUT/session.txt
fi
export FLASHCUTE_LIBRARY=$CAND
if [ ! -f $DIR/prebuilt_cand.tar.xz ] && room 150; then
  timeout 140 python3 -m pytest -q --no-header -p no:cacheprovider -x tests/python/test_gpu_grid.py \
    -k "(backward_grid and (bf16-64- or fp16-64-)) or (deterministic_bits and -64-window) or (forward_grid and bf16-64-)" \
    > $OUT/pytest.txt 2>&1
  echo "pytest hd64 backward (cand): exit $? at $(( $(date +%s) - t0 )) s"; tail -n 3 $OUT/pytest.txt
fi
for tool in racecheck synccheck memcheck; do
  room 60 && timeout 55 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_bwd.py 64 > $OUT/san-bwd-$tool.txt 2>&1
  echo "sanitize_bwd 64 $tool: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san-bwd-$tool.txt | tail -n1) at $(( $(date +%s) - t0 )) s"
done
