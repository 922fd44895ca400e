#!/usr/bin/env bash
# Session 27 call 2 (one H200): resnet::max_pool2d's kernels against ATen's max_pool2d. The GPU tests (values
# and gradients bit for bit; the LLaMA kernels after their conversions moved to examples/common); ResNet-50
# captured, fused max pooling against `--unfuse max-pool`, bf16 and tf32, alternating, two rounds; one profiled
# replay of each bf16 variant; the stem convolution with 3, 4 and 8 input channels. About 7 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
here=$(dirname "$0")
[[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_resnet_gpu_tests ddp_llama_gpu_tests > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
B=build/gpu
(cd $B && ctest -R "ResNetKernels|LlamaFusedOps" --output-on-failure > "$OUT/tests.log" 2>&1); echo "tests rc=$? at $SECONDS s"
grep -E "tests passed|Failed|FAILED|Passed" "$OUT/tests.log" | head -20
lb() {  # lb NAME FLAGS...
  local name=$1; shift
  timeout 120 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(grep -o '"step_ms": [0-9.]*' "$OUT/rows.jsonl" | tail -1) $(tail -c 300 /tmp/run.log | grep -i error)"
}
r="--model resnet50 --steps 30 --warmup 6 --cuda-graph"
for round in 1 2; do
  for p in bf16 tf32; do
    lb "$p-fused-$round" $r --precision $p
    lb "$p-aten-$round" $r --precision $p --unfuse max-pool
  done
done
lb bf16-fused-profiled $r --precision bf16 --steps 5 --profile-trace /tmp/fused.json
lb bf16-aten-profiled $r --precision bf16 --steps 5 --unfuse max-pool --profile-trace /tmp/aten.json
python3 benchmarks/scaling/kernel_diff.py --labels aten,fused --top 12 --width 110 /tmp/aten.json /tmp/fused.json > "$OUT/diff-max-pool.txt" 2>&1
head -22 "$OUT/diff-max-pool.txt"
for p in bf16 tf32; do python3 "$here/stem_conv_channels.py" $p 2>&1 | grep -v Warn; done | tee "$OUT/stem-conv.txt"
