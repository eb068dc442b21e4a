#!/usr/bin/env bash
# Device side of bench/pending/README.md: times the patch stack's libraries against main's in one process.
#   bash bench/pending/ab.sh DIR     DIR holds main.so, mask.so (0001), div.so (0001-0002), chain.so (0001-0004),
#                                    built on the CPU machine (README.md) and carried (xz-compressed: *.so.xz)
set -u
dir="$(cd "${1:?usage: bench/pending/ab.sh DIR}" && pwd)"
cd "$(dirname "$0")/../.."
for f in "$dir"/*.so.xz; do [ -e "$f" ] && xz -dkf "$f"; done
cp "$dir/main.so" "$dir/control.so"
export FLASHCUTE_LIBRARY="$dir/main.so" PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
run() {  # title, then bench/run.py arguments
  echo "=== $1"; shift
  python3 bench/run.py --impl flashcute --dtype bf16 --no-plots --no-ceilings --rounds 3 --target-s 0.08 \
    --lib "control=$dir/control.so" --lib "mask=$dir/mask.so" "$@" 2>&1 | awk '/hdim/{p=1} p' | grep -v '^wrote'
}
run "Hopper forward, hd64" --mode fwd --hdim 64 --seqlen 1k,4k,16k --causal 0,1 \
  --lib "div=$dir/div.so" --lib "chain=$dir/chain.so"
run "portable forward, hd64, FLASHCUTE_ARCH=80" --mode fwd --hdim 64 --seqlen 1k,4k,16k --causal 0,1 --arch 80 \
  --lib "chain=$dir/chain.so"
run "Hopper forward, hd128 causal" --mode fwd --hdim 128 --seqlen 1k,4k,16k --causal 1
run "Hopper backward, causal" --mode bwd --hdim 64,128 --seqlen 1k,4k,16k --causal 1
run "portable backward, causal, FLASHCUTE_ARCH=80" --mode bwd --hdim 64,128 --seqlen 1k,4k --causal 1 --arch 80
for f in main mask; do
  cuobjdump -sass "$dir/$f.so" > "/tmp/$f.sass" 2>/dev/null
  s="/tmp/$f.sass"
  echo "$f: R2P $(grep -c R2P "$s"), ISETP $(grep -c ISETP "$s"), FSEL $(grep -c FSEL "$s")"
done
