#!/usr/bin/env bash
# Call 1 (2 GPUs): configure, build, every GPU test; the A/B of NCCL symmetric buckets on LLaMA-1.1B bf16;
# the compute-interference probe. Usage: OUT=... DDP_GIT_COMMIT=... bash .dbg/s10call1.sh
set -u
: "${OUT:?}"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort > "$OUT/env.txt"
timeout 400 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
B=build/gpu
run="$B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --json $OUT/ab-symmetric.jsonl"
for round in 1 2; do
  timeout 80 $run >> "$OUT/ab.log" 2>&1; echo "default rc=$?" >> "$OUT/ab.log"
  timeout 80 $run --nccl-symmetric-buckets >> "$OUT/ab.log" 2>&1; echo "symmetric rc=$?" >> "$OUT/ab.log"
done
timeout 45 python3 benchmarks/allreduce/compute_interference.py --json "$OUT/interference.jsonl" > "$OUT/interference.log" 2>&1
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|Total Test" "$OUT/ctest_gpu.log" | head -20
grep -E "Failed|Timeout" "$OUT/ctest_gpu.log" | head -20
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/ab-symmetric.jsonl")]
for r in rows:
    print(r.get("nccl_symmetric_buckets"), r["throughput"], r["backward_ms"], r["exposed_comm_ms"], r["peak_mem_gib"])
PY
tail -n 3 "$OUT/ab.log"
cat "$OUT/interference.log"
