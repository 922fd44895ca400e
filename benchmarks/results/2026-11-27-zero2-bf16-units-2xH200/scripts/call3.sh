#!/usr/bin/env bash
# Session 16, call 3 (one GPU, ideally nvidia-h200), run ON branch gpu-run-16 with
# carry [".dbg/s16call3.sh", ".dbg/cast-register-tiles.patch"]: the FP8 GPU tests with the register-tile cast kernel,
# then A/B on one machine: precision_bench's cast rows (against the copy in the same process) and LLaMA-1.1B fp8
# (fast accumulation, captured), new / old (patch reverse-applied) / new; ncu on two cast launches if ncu exists.
set -u
: "${OUT:?}"
B=build/gpu
llama="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph"
measure() {  # measure NAME
  timeout 60 $B/benchmarks/precision/precision_bench --markdown "$OUT/precision-$1.md" > /dev/null 2>&1; echo "precision $1 rc=$? at $SECONDS s"
  grep -E "cast|copy" "$OUT/precision-$1.md"
  timeout 60 $llama --json "$OUT/llama-$1.jsonl" > /dev/null 2>&1; echo "llama $1 rc=$? at $SECONDS s"
}
measure new-1
git apply -R .dbg/cast-register-tiles.patch && cmake --build $B --target precision_bench scaling_bench > "$OUT/rebuild-old.log" 2>&1 && measure old
git apply .dbg/cast-register-tiles.patch && cmake --build $B --target precision_bench scaling_bench > "$OUT/rebuild-new.log" 2>&1 && [[ $SECONDS -lt 480 ]] && measure new-2
if command -v ncu > /dev/null && [[ $SECONDS -lt 500 ]]; then
  timeout 80 ncu --kernel-name regex:float8_tile_kernel --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy $B/benchmarks/precision/precision_bench --iterations 1 --trials 1 > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
fi
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/llama-*.jsonl")):
    for r in map(json.loads, open(f)):
        print(f.split("/")[-1], r["throughput"], r["step_ms"])
PY
