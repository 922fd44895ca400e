#!/usr/bin/env bash
# Call 1 (1 GPU): build, precision_bench (casts beside a copy of the same bytes), the A/B of grouped-query attention
# (SDPA enable_gqa, default) against repeated heads (--repeat-kv-heads), interleaved; one profiled step of each.
set -u
: "${OUT:?}"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
timeout 330 bash cmake/scripts/gpu_check.sh "$OUT" precision > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
B=build/gpu
run="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama --steps 15 --warmup 6"
for round in 1 2 3; do
  timeout 60 $run --precision bf16 --json $OUT/ab-gqa.jsonl >> "$OUT/ab.log" 2>&1; echo "grouped rc=$?" >> "$OUT/ab.log"
  timeout 60 $run --precision bf16 --repeat-kv-heads --json $OUT/ab-gqa.jsonl >> "$OUT/ab.log" 2>&1; echo "repeated rc=$?" >> "$OUT/ab.log"
done
timeout 60 $run --precision fp8 --fp8-fast-accum --json $OUT/ab-gqa-fp8.jsonl >> "$OUT/ab.log" 2>&1
timeout 60 $run --precision fp8 --fp8-fast-accum --repeat-kv-heads --json $OUT/ab-gqa-fp8.jsonl >> "$OUT/ab.log" 2>&1
timeout 60 $run --precision bf16 --steps 3 --warmup 4 --profile-trace "$OUT/trace-grouped.json" > "$OUT/trace.log" 2>&1
timeout 60 $run --precision bf16 --steps 3 --warmup 4 --repeat-kv-heads --profile-trace "$OUT/trace-repeated.json" >> "$OUT/trace.log" 2>&1
gzip -f "$OUT"/trace-*.json
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
tail -n 2 "$OUT/gpu_check.log"
grep -E "^\|" "$OUT/precision.md" | head -40
python3 - "$OUT" <<'PY'
import json, sys
for f in ("ab-gqa.jsonl", "ab-gqa-fp8.jsonl"):
    for l in open(sys.argv[1] + "/" + f):
        r = json.loads(l)
        print(f, r.get("repeat_kv_heads"), r["throughput"], r.get("forward_ms"), r.get("backward_ms"), r.get("peak_mem_gib"))
PY
grep -E "rc=" "$OUT/ab.log" | tr '\n' ' '
