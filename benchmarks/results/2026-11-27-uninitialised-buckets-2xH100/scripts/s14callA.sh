#!/usr/bin/env bash
# Session 14 call A (2 GPUs), on branch pending-gpu-run: its GPU tests (uninitialised buckets, stronger copy-engine
# sharded test), then A/B on one machine, LLaMA-1.1B bf16 captured, ZeRO-2 + copy engines: uninitialised buckets
# (the branch) against at::zeros buckets (the branch's reducer change reverse-applied), interleaved after/before/after.
set -u
: "${OUT:?}"
CTEST_ARGS="-R (Shard|CopyEngine|DdpNccl)" timeout 360 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Failed  |Exception" "$OUT/ctest_gpu.log" | head -20
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph"
run2() { timeout 50 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench --sharding gradients --copy-engine-reductions --json "$OUT/ab-$1.jsonl" >> "$OUT/ab.log" 2>&1; echo "$1 rc=$? at $SECONDS s"; }
rebuild() { cmake --build $B -j "$(nproc)" --target scaling_bench > "$OUT/rebuild-$1.log" 2>&1; echo "rebuild $1 rc=$? at $SECONDS s"; }
timeout 50 $B/libddp/ddprun --nproc-per-node 1 --standalone $bench --json "$OUT/ab-1gpu.jsonl" >> "$OUT/ab.log" 2>&1; echo "1gpu rc=$?"
run2 uninit-1
git apply -R .dbg/uninit-buckets.patch && rebuild zeros && run2 zeros-1
git apply .dbg/uninit-buckets.patch && rebuild uninit && [[ $SECONDS -lt 520 ]] && run2 uninit-2
[[ $SECONDS -lt 530 ]] && git apply -R .dbg/uninit-buckets.patch && rebuild zeros2 && [[ $SECONDS -lt 550 ]] && run2 zeros-2
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/ab-*.jsonl")):
    for r in map(json.loads, open(f)):
        print(f.split("/")[-1], r["gpus"], r.get("sharding"), r["throughput"], r["step_ms"])
PY
