#!/usr/bin/env bash
# Pending GPU validation of this branch (the library writes varlen rows no sequence owns; not yet run on a GPU).
# On the device, with a full prebuilt library of this branch (scripts/prebuild.sh) carried as .prebuilt.tar.xz and
# main's library and python/ unpacked under OLD (a folder holding .prebuilt/ and python/) for the A/B:
#   run(command='OLD=/tmp/old bash bench/pending/varlen_fill.sh', carry=['.prebuilt.tar.xz', ...])
# Merge once memcheck is clean, pytest passes and the timing shows no varlen call slower than main's; then delete
# bench/pending/.
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/flashcute-out}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -d .prebuilt ] || tar -xJf .prebuilt.tar.xz
NEW="FLASHCUTE_LIBRARY=$PWD/.prebuilt/lib/libflashcute.so PYTHONPATH=$PWD/python"
env $NEW timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/pending/varlen_fill_memcheck.py 2>&1 | tail -2
env $NEW timeout 300 python3 -m pytest -q --no-header -p no:cacheprovider tests/python > "$out/pytest.txt" 2>&1
echo "pytest $?"; tail -3 "$out/pytest.txt"
if [ -n "${OLD:-}" ]; then
  for i in 1 2; do
    env FLASHCUTE_LIBRARY="$OLD/.prebuilt/lib/libflashcute.so" PYTHONPATH="$OLD/python" \
      timeout 60 python3 bench/pending/varlen_fill_timing.py > "$out/old$i.txt" 2>&1
    env $NEW timeout 60 python3 bench/pending/varlen_fill_timing.py > "$out/new$i.txt" 2>&1
  done
  paste -d'|' "$out/old1.txt" "$out/new1.txt" "$out/old2.txt" "$out/new2.txt"
fi
