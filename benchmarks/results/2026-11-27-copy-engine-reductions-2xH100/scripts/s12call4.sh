#!/usr/bin/env bash
# Session 12 call 4 (2 GPUs): build; one profiled LLaMA-1.1B bf16 step on 1 GPU, on 2 GPUs with NCCL and with the
# copy engines (traces for the kernel-by-kernel comparison of the backward).
set -u
: "${OUT:?}"
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/build.log" 2>&1; echo "build rc=$?" >> "$OUT/build.log"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 6 --warmup 3 --json $OUT/prof.jsonl"
timeout 70 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench --profile-trace "$OUT/trace-1gpu.json" >> "$OUT/prof.log" 2>&1
timeout 70 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench --profile-trace "$OUT/trace-nccl.json" >> "$OUT/prof.log" 2>&1
timeout 70 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench --copy-engine-reductions --profile-trace "$OUT/trace-ce.json" >> "$OUT/prof.log" 2>&1
gzip -f "$OUT"/trace-*.json
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz . 2>/dev/null
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/prof.jsonl")):
    print(r["gpus"], r.get("copy_engine_reductions"), r["throughput"], r["backward_ms"], r["exposed_comm_ms"])
PY
grep -iE "error" "$OUT/prof.log" | head
