#!/usr/bin/env bash
# A second source tree beside this one, for A/B timing on a lent GPU machine in one call (bench/RESULTS.md, tenth
# session, run 5). Two steps:
#   here:    bash scripts/ab_tree.sh pack REF      writes ab-tree.tar (REF's sources; untracked, so the device tool
#                                                 copies it with the working tree) and prints its size
#   device:  bash scripts/ab_tree.sh build [KERNELS]
#                                                 unpacks ab-tree.tar into /tmp/ab-tree (sharing this tree's
#                                                 third_party/), builds the kernel subset KERNELS (a regex, default
#                                                 all) for the GPU found there and prints the library's path last:
#            FLASHCUTE_LIBRARY="$(bash scripts/ab_tree.sh build sm90_fwd_bf16 | tail -n1)" python3 bench/run.py ...
# Delete ab-tree.tar once done (it is not ignored, so git status shows it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
case "${1:-}" in
  pack)
    ref="${2:?usage: scripts/ab_tree.sh pack REF}"
    git -C "$root" archive --format=tar "$ref" CMakeLists.txt cmake include src scripts tests python reference \
      > "$root/ab-tree.tar"
    echo "ab-tree.tar: $ref ($(git -C "$root" rev-parse --short "$ref")), $(du -h "$root/ab-tree.tar" | cut -f1)" ;;
  build)
    dir=/tmp/ab-tree
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$dir" -xf "$root/ab-tree.tar"
    ln -sfn "$root/third_party" "$dir/third_party"
    bash "$dir/scripts/build.sh" auto -DFLASHCUTE_KERNELS="${2:-all}" 2> "$dir/build.txt" | tail -n1 | sed 's|$|/lib/libflashcute.so|' ;;
  *)
    echo "usage: scripts/ab_tree.sh pack REF | build [KERNELS]" >&2
    exit 2 ;;
esac
