#!/usr/bin/env bash
# Session 14 call B (2 GPUs, warm after call A), branch pending-gpu-run: A/B of the copy-engine add kernel's grid cap
# (1024 now, 264, 66 blocks), LLaMA-1.1B bf16 captured, ZeRO-2 + copy engines, interleaved.
set -u
: "${OUT:?}"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph"
cp libddp/comm/copy_engine_kernels.cu /tmp/cek.cu
for cap in 1024 264 66 1024 264 66; do
  [[ $SECONDS -gt 520 ]] && break
  sed -i "s/, [0-9]*));$/, $cap));/" libddp/comm/copy_engine_kernels.cu && grep -c "(packs + kThreads - 1) / kThreads, $cap)" libddp/comm/copy_engine_kernels.cu
  cmake --build $B -j "$(nproc)" --target scaling_bench > "$OUT/rebuild-$cap.log" 2>&1 || { echo rebuild failed; break; }
  timeout 50 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench --sharding gradients --copy-engine-reductions --json "$OUT/cap-$cap.jsonl" >> "$OUT/ab.log" 2>&1
  echo "cap $cap rc=$? at $SECONDS s"
done
cp /tmp/cek.cu libddp/comm/copy_engine_kernels.cu
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/cap-*.jsonl")):
    for r in map(json.loads, open(f)):
        print(f.split("/")[-1], r["gpus"], r.get("sharding"), r["throughput"], r["step_ms"])
PY
