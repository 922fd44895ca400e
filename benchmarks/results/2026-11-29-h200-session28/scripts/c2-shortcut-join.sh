#!/usr/bin/env bash
# Session 28 call 2 (one H200): the tree with FusedAdamW on libddp's own kernel (stripped to the fp32 gradients it
# uses) and ResNet-50's joined shortcut gradient. The GPU tests of both; ResNet-50 captured, joined against
# --unfuse shortcut-gradient (the same binary), bf16 and tf32, alternating, two rounds; one profiled bf16 replay of
# each, diffed by kernel. About 8 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
B=build/gpu
lb() {  # lb NAME FLAGS...
  local name=$1; shift
  timeout 120 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*') $(tail -c 300 /tmp/run.log | grep -i error)"
}
r="--model resnet50 --steps 20 --warmup 5 --cuda-graph"
for round in 1 2; do
  for p in bf16 tf32; do
    lb joined-$p-$round $r --precision $p
    lb unjoined-$p-$round $r --precision $p --unfuse shortcut-gradient
  done
done
lb joined-profiled $r --precision bf16 --profile-trace /tmp/joined.json
lb unjoined-profiled $r --precision bf16 --unfuse shortcut-gradient --profile-trace /tmp/unjoined.json
python3 benchmarks/scaling/kernel_diff.py --labels unjoined,joined --top 30 --gaps 8 --width 110 /tmp/unjoined.json \
  /tmp/joined.json > "$OUT/diff-joined.txt" 2>&1
gzip -c /tmp/joined.json > "$OUT/resnet-bf16-joined.json.gz"
cmake --build build/gpu --target ddp_adamw_segments_gpu_tests ddp_precision_gpu_tests ddp_captured_gpu_tests \
  ddp_resnet_gpu_tests > /tmp/build-tests.log 2>&1
echo "test build rc=$? at $SECONDS s"
(cd $B && timeout $((590 - SECONDS)) ctest -R "AdamWSegments|FusedAdamW|FusedOptimizers|CapturedStep|ResNetKernels" \
  --output-on-failure > "$OUT/tests.log" 2>&1)
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|FAILED|differs" "$OUT/tests.log" | head -20
