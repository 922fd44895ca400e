#!/usr/bin/env bash
# The main job: builds libddp and runs the example on every local GPU, or on
# 2 CPU processes when there is none.
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
cmake --build "$build" --target ddprun collectives_smoke
"$build/libddp/ddprun" --nproc-per-node auto --standalone "$build/examples/smoke/collectives_smoke"
