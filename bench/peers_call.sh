#!/usr/bin/env bash
# One device call for the README's tables: the Hopper kernels beside FlashAttention-4, cuDNN and FA2
# (`DEADLINE=200 bash bench/peers_call.sh`: about 110 s on a warm H100).
# Carry [".peers", "build/peerlib"] (../shared/peers/fa4/pack.sh fills .peers, about 60 MB, so the library travels as
# a subset: libflashcute.so.xz of cmake -DFLASHCUTE_KERNELS=
# 'sm90_(fwd_bf16_hd(64_m(128n128|192)|128_m(128n128|64n128)|256_)|bwd_bf16_hd(64|128|256)_)', 1.6 MB).
# Then, here: python3 bench/run.py --from-json <results.json> --readme.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-/tmp/out}
t0=$(date +%s)
eval "$(bash .peers/unpack.sh)"
mkdir -p /tmp/pe && xz -dc build/peerlib/libflashcute.so.xz > /tmp/pe/libflashcute.so
export FLASHCUTE_LIBRARY=/tmp/pe/libflashcute.so PYTHONPATH=$PWD/python:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout -s INT -k 15 ${DEADLINE:-540} python3 bench/run.py --mode fwd,bwd --impl flash,cudnn,fa4,flashcute \
  --dtype bf16 --hdim 64,128,256 --seqlen 1k,4k,16k --causal 0,1 --target-s 0.06 --no-plots --out $OUT/peers \
  > $OUT/peers.txt 2>&1
echo "peers: exit $? at $(( $(date +%s) - t0 )) s"; awk '/hdim/{p=1} p' $OUT/peers.txt | head -60
