#!/usr/bin/env bash
# Call 2b (1 GPU, warm): the A/B of each new fusion on LLaMA-1.1B bf16, interleaved, two rounds; fp8 with all and
# none; one profiled step with all.
set -u
: "${OUT:?}"
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" build_only > "$OUT/build.log" 2>&1
run="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama --steps 15 --warmup 6"
NONE=loss,residual-norm,fp32-weight-gradients
for round in 1 2; do
  for u in "" loss residual-norm fp32-weight-gradients $NONE; do
    timeout 60 $run --precision bf16 ${u:+--unfuse $u} --json $OUT/ab-fusions.jsonl >> "$OUT/ab.log" 2>&1
    echo "bf16 unfuse=$u rc=$?" >> "$OUT/ab.log"
  done
done
for u in "" $NONE; do
  timeout 60 $run --precision fp8 --fp8-fast-accum ${u:+--unfuse $u} --json $OUT/ab-fusions-fp8.jsonl >> "$OUT/ab.log" 2>&1
  echo "fp8 unfuse=$u rc=$?" >> "$OUT/ab.log"
done
timeout 60 $run --precision bf16 --steps 3 --warmup 4 --profile-trace "$OUT/trace-fused.json" > "$OUT/trace.log" 2>&1
gzip -f "$OUT"/trace-*.json
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
python3 - "$OUT" <<'PY'
import json, sys
for f in ("ab-fusions.jsonl", "ab-fusions-fp8.jsonl"):
    for l in open(sys.argv[1] + "/" + f):
        r = json.loads(l)
        print(f, repr(r.get("unfuse")), r["throughput"], r.get("forward_ms"), r.get("backward_ms"), r.get("optimizer_ms"), r.get("peak_mem_gib"), r.get("loss"))
PY
grep -E "rc=" "$OUT/ab.log" | tr '\n' ' '
