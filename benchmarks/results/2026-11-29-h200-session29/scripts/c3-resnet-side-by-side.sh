#!/usr/bin/env bash
# Session 29 call 3 (one H200): ResNet-50 side by side in one lease after the max-pool tiles and the batch counts in
# one add: libddp captured against torch.compile and its CUDA-graph mode, bf16 and tf32 (run_scaling). About 9 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
rs() {  # rs NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/scaling/run_scaling.py --gpus 1 --steps 20 --warmup 5 --out "$OUT" --prefix "$name" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"; grep -E "img/s|tok/s|rror" "$OUT/$name.log" | grep -v "^run_scaling: .*: /" | cut -c1-170
}
rs resnet-bf16 250 --models resnet50 --precisions bf16 --impls libddp-graph,pytorch-compile,pytorch-compile-graphs
rs resnet-tf32 $((580 - SECONDS)) --models resnet50 --precisions tf32 --impls libddp-graph,pytorch-compile,pytorch-compile-graphs
