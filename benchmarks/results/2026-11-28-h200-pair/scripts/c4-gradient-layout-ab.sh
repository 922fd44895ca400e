#!/usr/bin/env bash
# Session 22 call 4 (2 GPUs): does a 2-GPU ResNet-50 step still copy its gradients into the buckets one parameter
# at a time? The layouts cuDNN gives 1x1-convolution weight gradients, then ResNet-50 bf16 captured at 2 GPUs
# with 736d6e6 (same_memory_layout) and without it (same-memory-layout.patch reversed), profiled, interleaved.
set -u
: "${OUT:?}"
S=benchmarks/results/2026-11-28-h200-pair/scripts
nvidia-smi -L
python3 - <<'PY'
import torch
x = torch.randn(8, 64, 14, 14, device="cuda").to(memory_format=torch.channels_last)
for k in (1, 3):
    conv = torch.nn.Conv2d(64, 256, k, bias=False).cuda().to(memory_format=torch.channels_last)
    with torch.autocast("cuda", torch.bfloat16):
        conv(x).float().sum().backward()
    print(f"conv {k}x{k}: weight strides {conv.weight.stride()}, gradient strides {conv.weight.grad.stride()}")
PY
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
build() { cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"; }
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 60 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
r="--model resnet50 --precision bf16 --steps 20 --warmup 5 --cuda-graph --copy-engine-reductions"
build
lb new-1 1 $r
lb new-2 2 $r --profile-trace /tmp/new-2.json
git apply -R $S/same-memory-layout.patch && build
lb old-2 2 $r --profile-trace /tmp/old-2.json
git apply $S/same-memory-layout.patch && build
lb new-2-again 2 $r
python3 benchmarks/scaling/kernel_diff.py --labels old,new --top 10 --width 100 /tmp/old-2.json /tmp/new-2.json \
  > "$OUT/diff-old-new.txt" 2>&1; head -c 2500 "$OUT/diff-old-new.txt"
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["model"], r["precision"], r["gpus"], round(r["throughput"]), r.get("step_ms"))
PY
