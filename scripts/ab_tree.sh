#!/usr/bin/env bash
# Other source trees beside this one, for A/B timing on a lent GPU machine in one call (bench/RESULTS.md, tenth
# session, run 5). Two steps:
#   here:    bash scripts/ab_tree.sh pack REF [NAME [PATCH...]]
#                                                       writes NAME.tar (default ab-tree; REF's sources, with the
#                                                       git-format-patch files PATCH... applied in order;
#                                                       untracked, so the device tool copies it with the working
#                                                       tree) and prints its size
#   device:  bash scripts/ab_tree.sh build [KERNELS] [NAME]
#                                                       unpacks NAME.tar into /tmp/NAME (sharing this tree's
#                                                       third_party/), builds the kernel subset KERNELS (a regex,
#                                                       default all) for the GPU found there and prints the
#                                                       library's path last:
#            FLASHCUTE_LIBRARY="$(bash scripts/ab_tree.sh build sm90_fwd_bf16 | tail -n1)" python3 bench/run.py ...
# The test binaries are not built (the library is what an A/B times). A backward timed or checked through Python runs
# the forward first: the subset needs both directions' kernels (e.g. 'sm90_(fwd|bwd)_bf16_hd128_'). Several trees
# build one after another (or side by side: start each in the background and wait for their PIDs, never a bare
# `wait` in a script whose output goes through `exec > >(tee ...)`, which also waits for the tee and hangs until the
# device call's limit).
# Delete the .tar files once done (they are not ignored, so git status shows them).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
case "${1:-}" in
  pack)
    ref="${2:?usage: scripts/ab_tree.sh pack REF [NAME [PATCH...]]}"
    name="${3:-ab-tree}"
    shift $(( $# < 3 ? $# : 3 ))
    tree="$ref" patched=""
    if [ $# -gt 0 ]; then
      tmp="$(mktemp -d)"
      git -C "$root" worktree add -q --detach "$tmp/tree" "$ref"
      for f in "$@"; do
        git -C "$tmp/tree" -c user.name=ab -c user.email=ab@localhost am -q "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")"
      done
      tree="$(git -C "$tmp/tree" rev-parse HEAD)" patched=" + $# patch(es)"
    fi
    git -C "$root" archive --format=tar "$tree" CMakeLists.txt cmake include src scripts tests python reference \
      > "$root/$name.tar"
    [ -n "$patched" ] && git -C "$root" worktree remove --force "$tmp/tree" && rm -rf "$tmp"
    echo "$name.tar: $ref ($(git -C "$root" rev-parse --short "$ref"))$patched, $(du -h "$root/$name.tar" | cut -f1)" ;;
  build)
    name="${3:-ab-tree}"
    dir="/tmp/$name"
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$dir" -xf "$root/$name.tar"
    ln -sfn "$root/third_party" "$dir/third_party"
    bash "$dir/scripts/build.sh" auto -DFLASHCUTE_KERNELS="${2:-all}" -DFLASHCUTE_BUILD_TESTS=OFF 2> "$dir/build.txt" |
      tail -n1 | sed 's|$|/lib/libflashcute.so|' ;;
  *)
    echo "usage: scripts/ab_tree.sh pack REF [NAME [PATCH...]] | build [KERNELS] [NAME]" >&2
    exit 2 ;;
esac
