#!/usr/bin/env bash
# The main job: builds libddp and trains the LLaMA example: TinyLlama-1.1B in
# bf16 on every local GPU, or, with no GPU, a tiny model on 2 CPU processes
# learning a text every Debian and Ubuntu system ships (the loss falls well
# below the uniform guess, ln 256 = 5.55).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

gpus=$(ls -d /proc/driver/nvidia/gpus/* 2>/dev/null | wc -l || true)
if ((gpus > 0)); then
  python3 -c 'import torch' 2>/dev/null || python3 -m pip install --quiet torch
  flavour=python
else
  bash cmake/scripts/setup_debian.sh
  flavour=system
fi
build=build/main-$flavour
bash cmake/scripts/configure.sh "$flavour" "$build" >/dev/null
cmake --build "$build" --target ddprun train_llama make_tokens
run="$build/libddp/ddprun --nproc-per-node auto --standalone $build/examples/llama/train_llama"
if ((gpus > 0)); then
  $run --preset tinyllama-1.1b --precision bf16 --steps 100 --warmup 10 --log-every 10 --eval-batches 2
else
  text=$build/gpl3
  "$build/examples/make_tokens" --input /usr/share/common-licenses/GPL-3 --output "$text.bin" \
    --val-fraction 0.1 --val-output "$text.val.bin"
  $run --preset tiny --precision fp32 --batch 16 --lr 3e-3 --steps 300 --log-every 25 --eval-every 100 \
    --data "$text.bin" --val-data "$text.val.bin"
fi
