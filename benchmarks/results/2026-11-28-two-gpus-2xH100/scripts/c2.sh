#!/usr/bin/env bash
# Session 21 call 2 (2 GPUs, after c1): ResNet-50 bf16 --sync-bn both sides, 1 -> 2; LLaMA fp8/bf16 eager 1 vs 2
# GPUs profiled (ZeRO-2 bf16 units, copy engines), kernels that differ.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
timeout 240 python3 benchmarks/scaling/run_scaling.py --build $B --gpus 1,2 --models resnet50 --precisions bf16 \
  --impls libddp-graph,pytorch --sync-bn --steps 15 --warmup 5 --timeout 110 --out "$OUT" --prefix sync-bn-resnet50 \
  > "$OUT/sync-bn-scaling.log" 2>&1
echo "run_scaling rc=$? at $SECONDS s"; grep -E "img/s|rror|unavailable|efficiency" "$OUT/sync-bn-scaling.log" | head -16
for p in fp8 bf16; do
  extra=""; [[ $p == fp8 ]] && extra=--fp8-fast-accum
  for n in 1 2; do
    timeout 100 $B/libddp/ddprun --nproc-per-node $n --standalone $B/benchmarks/scaling/scaling_bench --model llama \
      --precision $p $extra --sharding gradients --param-dtype bf16 --copy-engine-reductions --warmup 4 --steps 6 \
      --json "$OUT/profile-rows.jsonl" --profile-trace /tmp/$p-$n.json > /tmp/run.log 2>&1
    echo "$p $n rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
  done
  python3 benchmarks/scaling/kernel_diff.py --labels 1gpu,2gpu --gaps 6 --top 20 /tmp/$p-1.json /tmp/$p-2.json > "$OUT/diff-$p.txt" 2>&1
  head -c 2500 "$OUT/diff-$p.txt"
done
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/profile-rows.jsonl")):
    print(r["model"], r["precision"], r["gpus"], round(r["throughput"]), r.get("step_ms"), r.get("exposed_comm_ms"), r.get("peak_mem_gib"))
PY
