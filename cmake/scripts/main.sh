#!/usr/bin/env bash
# The main job: builds libddp and trains the LLaMA example on real text, read
# with the project's byte-level tokenizer (make_tokens; uniform guess ln 256 =
# 5.55): TinyLlama-1.1B in bf16 on every local GPU, on the top-level modules of
# the Python standard library that the GPU build's python3 brings (~5 MB of
# code and docstrings), or, with no GPU, a tiny model on 2 CPU processes on a
# text every Debian and Ubuntu system ships. Both print the uniform guess, the
# validation loss as it falls, and the throughput.
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
  text=$build/python-stdlib
  stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
  find "$stdlib" -maxdepth 1 -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 cat > "$text.txt"
  "$build/examples/make_tokens" --input "$text.txt" --output "$text.bin" \
    --val-fraction 0.05 --val-output "$text.val.bin"
  $run --preset tinyllama-1.1b --vocab 256 --precision bf16 --steps 200 --warmup 20 --log-every 20 \
    --eval-every 100 --eval-batches 4 --data "$text.bin" --val-data "$text.val.bin"
else
  text=$build/gpl3
  "$build/examples/make_tokens" --input /usr/share/common-licenses/GPL-3 --output "$text.bin" \
    --val-fraction 0.1 --val-output "$text.val.bin"
  $run --preset tiny --precision fp32 --batch 16 --lr 3e-3 --steps 300 --log-every 25 --eval-every 100 \
    --data "$text.bin" --val-data "$text.val.bin"
fi
