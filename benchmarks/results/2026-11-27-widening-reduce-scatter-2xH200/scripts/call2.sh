#!/usr/bin/env bash
# Session 17 call 2 (kind nvidia-h200-x2; carry .dbg/s17call2.sh .dbg/widen.patch): the widening reduce-scatter
# (16-bit gradients straight into fp32 shards). Build; the collective, copy-engine and sharded GPU tests; then A/B on
# this machine, LLaMA-1.1B bf16 captured on the copy engines: new tree, old tree (patch reverse-applied), new again.
set -u
: "${OUT:?}"
nvidia-smi -L
CTEST_ARGS="-R (NcclCollectives|CopyEngineReductions|DdpNccl.Sharded|DdpNccl.CapturedStepWith(Bf16|Sharded|FullySharded)|ShardingCuda)" \
  timeout 330 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -c "warning:" "$OUT/build.log"
grep -E "tests passed|\*\*\*Failed|Failed  |Not Run" "$OUT/ctest_gpu.log" | head -20
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph"
run() {  # run NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  [[ $SECONDS -gt 540 ]] && { echo "$name skipped (time)"; return; }
  timeout 50 $B/libddp/ddprun --nproc-per-node "$n" --standalone $bench --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s"; tail -c 300 /tmp/run.log | grep -i error
}
zero2="--sharding gradients --param-dtype bf16 --copy-engine-reductions"
zero1="--sharding optimizer --param-dtype bf16 --copy-engine-reductions"
run new-zero2 2 $zero2
run new-zero1 2 $zero1
run plain-1 1
git apply -R .dbg/widen.patch && cmake --build $B --target scaling_bench > "$OUT/rebuild-old.log" 2>&1; echo "old built rc=$? at $SECONDS s"
run old-zero2 2 $zero2
run old-zero1 2 $zero1
git apply .dbg/widen.patch && cmake --build $B --target scaling_bench > "$OUT/rebuild-new.log" 2>&1; echo "new built rc=$? at $SECONDS s"
run new-zero2-again 2 $zero2
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/rows.jsonl")]
base = [r for r in rows if r["gpus"] == 1][0]["throughput"] if any(r["gpus"] == 1 for r in rows) else None
for r in rows:
    eff = f'{100 * r["throughput"] / (r["gpus"] * base):.2f}%' if base else ""
    print(r["gpus"], r["sharding"], r["param_dtype"], r["throughput"], r["step_ms"], r["peak_mem_gib"], r["final_loss"], eff)
PY
