#!/usr/bin/env bash
# Session 12 call 3 (2 GPUs): build; LLaMA-1.1B bf16 on 1 GPU and on 2 GPUs with NCCL / copy engines, fp32 and bf16
# gradient reduction, alternating; a profiled step of each 2-GPU transport; ResNet-50 bf16 NCCL vs copy engines.
set -u
: "${OUT:?}"
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/build.log" 2>&1; echo "build rc=$?" >> "$OUT/build.log"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab.jsonl"
two="$B/libddp/ddprun --nproc-per-node 2 --standalone $bench"
one="$B/libddp/ddprun --nproc-per-node 1 --standalone $bench"
for round in 1 2; do
  timeout 60 $one >> "$OUT/ab.log" 2>&1; echo "one rc=$?" >> "$OUT/ab.log"
  timeout 60 $two >> "$OUT/ab.log" 2>&1; echo "nccl rc=$?" >> "$OUT/ab.log"
  timeout 60 $two --copy-engine-reductions >> "$OUT/ab.log" 2>&1; echo "ce rc=$?" >> "$OUT/ab.log"
  timeout 60 $two --copy-engine-reductions --reduce-dtype bf16 >> "$OUT/ab.log" 2>&1; echo "ce bf16 rc=$?" >> "$OUT/ab.log"
done
timeout 70 $two --steps 6 --warmup 3 --copy-engine-reductions --profile-trace "$OUT/trace-ce.json.gz" --json "$OUT/prof.jsonl" >> "$OUT/prof.log" 2>&1
rn="$B/benchmarks/scaling/scaling_bench --model resnet50 --precision bf16 --steps 15 --warmup 6 --json $OUT/resnet.jsonl"
timeout 60 $B/libddp/ddprun --nproc-per-node 1 --standalone $rn >> "$OUT/resnet.log" 2>&1
timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $rn >> "$OUT/resnet.log" 2>&1
timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $rn --copy-engine-reductions >> "$OUT/resnet.log" 2>&1
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys, os
for f in ("ab.jsonl", "resnet.jsonl", "prof.jsonl"):
    p = sys.argv[1] + "/" + f
    if not os.path.exists(p): continue
    print(f)
    for r in map(json.loads, open(p)):
        print(" ", r["gpus"], "ce" if r.get("copy_engine_reductions") else "nccl", r["reduce_dtype"], r["throughput"], "step", r["step_ms"], "fwd", r["forward_ms"], "bwd", r["backward_ms"], "opt", r["optimizer_ms"], "exp", r["exposed_comm_ms"], "loss", r["final_loss"])
PY
grep -iE "error|rc=[1-9]" "$OUT/ab.log" "$OUT/resnet.log" "$OUT/prof.log" | head -10
