#!/usr/bin/env bash
# Session 18 call 4 (warm 2 GPUs after c3; carry .dbg/c4.sh): ResNet-50 bf16 captured at 2 GPUs, bucket size and
# transport sweep against one GPU (interleaved); ResNet-50 tf32 and LLaMA fp8 1 -> 2; LLaMA-2-7B ZeRO-3 bf16 units.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 90 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
r="--model resnet50 --precision bf16 --steps 20 --warmup 5 --cuda-graph"
lb resnet-1 1 $r
for cap in 10 25 50 100; do lb resnet-2-ce-$cap 2 $r --copy-engine-reductions --bucket-cap-mb $cap; done
lb resnet-2-nccl-25 2 $r
lb resnet-1-again 1 $r
for cap in 50 25; do lb resnet-2-ce-$cap-again 2 $r --copy-engine-reductions --bucket-cap-mb $cap; done
t="--model resnet50 --precision tf32 --steps 20 --warmup 5 --cuda-graph"
lb resnet-tf32-1 1 $t
lb resnet-tf32-2 2 $t --copy-engine-reductions
f="--model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph"
lb llama-fp8-1 1 $f
lb llama-fp8-2-zero2 2 $f --sharding gradients --param-dtype bf16 --copy-engine-reductions
lb llama-fp8-2-plain 2 $f --copy-engine-reductions
[[ $SECONDS -lt 420 ]] && lb llama2-7b-zero3-bf16 2 --model llama --preset llama2-7b --batch 1 --precision bf16 --sharding full \
  --param-dtype bf16 --steps 6 --warmup 2 --copy-engine-reductions
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl")]
for r in rows:
    print(r.get("impl", "?"), r["model"], r["precision"], r["gpus"], r.get("sharding", "-"), r.get("param_dtype", "-"),
          r.get("bucket_cap_mb"), r.get("nccl_env", ""), round(r["throughput"], 1), r.get("step_ms"), r.get("peak_mem_gib"))
PY
