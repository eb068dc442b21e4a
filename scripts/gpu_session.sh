#!/usr/bin/env bash
# One batched GPU session (for a lent GPU machine with no network): build for this GPU, run the C++ and Python
# tests, then a benchmark; logs under ${OUT:-/tmp/flashcute-out}. Environment knobs:
#   KERNELS  kernel subset regex (default all)      PYTEST_ARGS  pytest arguments (default: all tests; empty: none)
#   BENCH    bench/run.py arguments, empty to skip  BUILD_ONLY=1 stop after the build
#   TUNE     kernel config names to time one by one (forced with FLASHCUTE_CONFIG), e.g. sm80_fwd_bf16_hd128_m128n64w8;
#            each is timed in its own direction (fwd or bwd, from the name), at TUNE_SEQLEN (default 2k,8k);
#            name@NN times it under FLASHCUTE_ARCH=NN (occupancy-faithful emulation); TUNE_ARGS more bench arguments
#   PYTEST_TIMEOUT  seconds for the pytest run (default 300); TEST_TIMEOUT the same for each C++ test binary
#   SANITIZE=1  also run compute-sanitizer memcheck, racecheck and synccheck on tests/cpp/test_gpu_kernels
#               (SANITIZE=memcheck: memcheck alone)
#   PREBUILT    a folder holding lib/libflashcute.so and tests/cpp/test_* built elsewhere (scripts/prebuild.sh):
#               no build here; the test binaries run directly instead of through ctest. Unpacked from
#               PREBUILT.tar.xz first where only that is here.
#   FUZZ        run the long fuzz (tests/python/test_fuzz.py -m fuzz) with this many cases
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/flashcute-out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
start=$(date +%s)
if [ -n "${PREBUILT:-}" ] && [ ! -d "$root/$PREBUILT" ] && [ -f "$root/$PREBUILT.tar.xz" ]; then
  tar -C "$root" -xJf "$root/$PREBUILT.tar.xz"
fi
[ -n "${PREBUILT:-}" ] && export LD_LIBRARY_PATH="$root/$PREBUILT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -n "${PREBUILT:-}" ] && "$root/$PREBUILT/tests/cpp/test_dispatch" --gtest_brief=1 > /dev/null 2>&1; then
  dir="$root/$PREBUILT"
  echo "prebuilt: $dir"
else
  [ -n "${PREBUILT:-}" ] && echo "prebuilt binaries do not run here: building"
  dir="$(bash "$root/scripts/build.sh" auto -DFLASHCUTE_KERNELS="${KERNELS:-all}" 2> >(tee "$out/build.txt" >&2) | tail -n1)"
  echo "build: $(( $(date +%s) - start )) s"
  cp "$dir/build.log" "$out/build.log" 2>/dev/null
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
export FLASHCUTE_LIBRARY="$dir/lib/libflashcute.so" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
for t in "$dir"/tests/cpp/test_*; do
  [ -x "$t" ] || continue
  timeout "${TEST_TIMEOUT:-300}" "$t" --gtest_brief=1 > "$out/$(basename "$t").txt" 2>&1
  echo "$(basename "$t"): exit $? ($(grep -E 'PASSED|FAILED' "$out/$(basename "$t").txt" | tr '\n' ' '))"
done
if [ "${SANITIZE:-0}" != 0 ]; then
  # memcheck over every test (adversarial varlen offsets included); racecheck over the kernel shapes
  tools="memcheck racecheck synccheck"
  [ "${SANITIZE}" = memcheck ] && tools=memcheck
  for tool in $tools; do
    filter='*'
    [ "$tool" != memcheck ] && filter='Shapes/*:GpuKernelsEmpty*'
    timeout 200 compute-sanitizer --tool "$tool" --error-exitcode 9 "$dir/tests/cpp/test_gpu_kernels" \
      --gtest_filter="$filter" > "$out/sanitizer-$tool.txt" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.txt" | tail -n1))"
  done
fi
if [ -n "${FUZZ:-}" ]; then
  (cd "$root" && FLASHCUTE_FUZZ_COUNT="$FUZZ" timeout "${FUZZ_TIMEOUT:-560}" python3 -m pytest -q --no-header \
    -p no:cacheprovider -m fuzz tests/python/test_fuzz.py -s > "$out/fuzz.txt" 2>&1)
  echo "fuzz: exit $?"; grep -E "^fuzz:|passed|failed|seed" "$out/fuzz.txt" | head -n 12
fi
cd "$root"
pytest_args="${PYTEST_ARGS-tests/python}"  # set but empty: no pytest
if [ -n "$pytest_args" ]; then
  timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q --no-header -p no:cacheprovider --maxfail=40 \
    $pytest_args > "$out/pytest.txt" 2>&1
  grep -E "passed|failed|error" "$out/pytest.txt" | tail -n 3
  grep -E "^(FAILED|ERROR)|Error|assert" "$out/pytest.txt" | head -n 20
fi
if [ -n "${BENCH:-}" ]; then
  python3 bench/run.py ${BENCH} --out "$out/bench" > "$out/bench.txt" 2>&1
  tail -n 60 "$out/bench.txt"
fi
for entry in ${TUNE:-}; do
  cfg="${entry%@*}"; arch=""
  [ "$cfg" != "$entry" ] && arch="${entry#*@}"
  hd="$(echo "$cfg" | sed -E 's/.*_hd([0-9]+)_.*/\1/')"
  dt="$(echo "$cfg" | sed -E 's/.*_(bf16|fp16)_.*/\1/')"
  mode="$(echo "$cfg" | sed -E 's/.*_(fwd|bwd)_.*/\1/')"
  FLASHCUTE_ARCH="$arch" FLASHCUTE_CONFIG="$cfg" python3 bench/run.py --mode "$mode" --impl flashcute --dtype "$dt" \
    --hdim "$hd" --seqlen "${TUNE_SEQLEN:-2k,8k}" --causal 0,1 --no-plots --no-ceilings --out "$out/tune" \
    ${TUNE_ARGS:-} 2>&1 | grep -E '^ *[0-9]+ +(no|yes)' | sed "s/^/$entry /" | tee -a "$out/tune.txt"
done
