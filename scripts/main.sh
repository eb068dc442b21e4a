#!/usr/bin/env bash
# The main job: build for the GPU found here, run the smoke test through flashcute.flash_attn_func, then a short
# benchmark beside PyTorch's SDPA backends. On a machine without a GPU it builds the host library and runs the
# smoke test on CPU tensors through the float64 reference (no kernels, no timing).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
dir="$(bash "$root/scripts/build.sh" auto | tail -n1)"
export FLASHCUTE_LIBRARY="$dir/lib/libflashcute.so"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
python3 -m flashcute.info
python3 "$root/scripts/smoke.py"
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  python3 "$root/bench/run.py" --quick --no-plots --mode fwd,bwd --hdim 128 --seqlen 2k,8k "$@"
else
  echo "NOTE: no CUDA GPU here: the smoke test ran on CPU tensors through the float64 reference; no benchmark."
fi
