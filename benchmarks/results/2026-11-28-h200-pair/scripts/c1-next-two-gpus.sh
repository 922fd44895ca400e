#!/usr/bin/env bash
# For the next session with a two-GPU lease (written in session 21, not yet run). One call, ~8 min:
#  1. the NCCL tests of DDP with DDP_CHECK_COLLECTIVES=1 (the check has run on Gloo only);
#  2. scaling_bench --profile-trace of a captured replay (new in 822a975; does Kineto see the graph's kernels?);
#  3. LLaMA fp8 captured, ZeRO-2 with fp32 units against bf16 units, 1 -> 2 GPUs (fp32 units cost ~0 on one GPU);
#  4. ResNet-50 bf16 captured, 1 and 2 GPUs profiled: the kernels of the 0.65 ms the 2-GPU step adds.
#   run: OUT=... bash benchmarks/results/2026-11-28-two-gpus-2xH100/scripts/next-two-gpus.sh
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
DDP_CHECK_COLLECTIVES=1 timeout 150 ctest --test-dir $B -L gpu -R "DdpNccl" --output-on-failure > "$OUT/ddp-nccl-checked.log" 2>&1
echo "DdpNccl with the check rc=$? at $SECONDS s"; grep -E "tests passed|\*\*\*Failed" "$OUT/ddp-nccl-checked.log" | head -5
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 70 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
f="--model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph --copy-engine-reductions"
lb fp8-1-plain 1 $f --profile-trace /tmp/fp8-1.json
lb fp8-1-zero2-bf16 1 $f --sharding gradients --param-dtype bf16 --profile-trace /tmp/fp8-1-zero2.json
python3 benchmarks/scaling/kernel_diff.py --labels plain,zero2 --top 16 --width 110 /tmp/fp8-1.json /tmp/fp8-1-zero2.json \
  > "$OUT/diff-captured-fp8-1gpu.txt" 2>&1; head -c 2500 "$OUT/diff-captured-fp8-1gpu.txt"
lb fp8-2-zero2-bf16 2 $f --sharding gradients --param-dtype bf16
lb fp8-2-zero2-fp32 2 $f --sharding gradients
lb fp8-2-zero2-bf16-again 2 $f --sharding gradients --param-dtype bf16
lb fp8-2-zero2-fp32-again 2 $f --sharding gradients
r="--model resnet50 --precision bf16 --steps 20 --warmup 5 --cuda-graph --copy-engine-reductions"
lb resnet-1 1 $r --profile-trace /tmp/resnet-1.json
lb resnet-2 2 $r --profile-trace /tmp/resnet-2.json
python3 benchmarks/scaling/kernel_diff.py --labels 1gpu,2gpu --top 16 --width 110 --gaps 5 /tmp/resnet-1.json /tmp/resnet-2.json \
  > "$OUT/diff-captured-resnet.txt" 2>&1; head -c 3000 "$OUT/diff-captured-resnet.txt"
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["model"], r["precision"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype"), round(r["throughput"]), r.get("step_ms"))
PY
