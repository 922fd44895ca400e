#!/usr/bin/env bash
# Session 13 call 7 (2 GPUs): build; one profiled LLaMA-1.1B bf16 eager run with ZeRO-2 on the copy engines
# (same flags as session 12's call 4, whose 1-GPU and plain copy-engine traces it is compared with).
set -u
: "${OUT:?}"
timeout 170 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 6 --warmup 3 --json $OUT/prof.jsonl"
timeout $((225 - SECONDS)) $B/libddp/ddprun --nproc-per-node 2 --standalone $bench --sharding gradients --copy-engine-reductions \
  --profile-trace "$OUT/trace-zero2-ce.json" > "$OUT/prof.log" 2>&1; echo "prof rc=$? at $SECONDS s"
gzip -f "$OUT"/trace-*.json
grep -iE "error" "$OUT/prof.log" | head -3
