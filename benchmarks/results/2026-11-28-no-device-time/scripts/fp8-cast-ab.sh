#!/usr/bin/env bash
# For the next session with device time (one GPU, ideally an H200): the FP8 cast with 128-row tiles for one
# bf16/fp16 input (fp8-cast-128-row-tiles.patch, written 2026-11-28, compiled in the CUDA configuration, never
# run). Configure and build for sm_90, run the FP8 GPU tests with the patch, then A/B on the one machine:
# precision_bench's cast rows (each against the device copy measured in the same process) and LLaMA-1.1B fp8
# (fast accumulation, captured): new / old (patch reverse-applied) / new / old. Keep the patch only if the
# bf16 cast rows and LLaMA's tok/s both win; either way record the rows under benchmarks/results/.
#   run: bash benchmarks/results/2026-11-28-no-device-time/scripts/fp8-cast-ab.sh
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-28-no-device-time/scripts
patch=$here/fp8-cast-128-row-tiles.patch
B=build/gpu
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
git apply "$patch" || exit 1
bash cmake/scripts/configure.sh python $B -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > "$OUT/configure.log" 2>&1 &&
  cmake --build $B -j "$(nproc)" --target ddp_float8_gpu_tests precision_bench scaling_bench ddprun > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; grep -E "error" "$OUT/build.log" | head; exit 1; }
echo "built at $SECONDS s"
$B/tests/ddp_float8_gpu_tests > "$OUT/float8-tests-new.log" 2>&1; echo "float8 tests (new) rc=$?"
grep -E "^\[  (PASSED|FAILED) " "$OUT/float8-tests-new.log"
llama="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph"
measure() {  # measure NAME
  timeout 60 $B/benchmarks/precision/precision_bench --markdown "$OUT/precision-$1.md" > /dev/null 2>&1
  echo "precision $1 rc=$? at $SECONDS s"; grep -E "cast|copy" "$OUT/precision-$1.md"
  timeout 90 $llama --json "$OUT/llama-$1.jsonl" > /dev/null 2>&1; echo "llama $1 rc=$? at $SECONDS s"
}
rebuild() { cmake --build $B --target precision_bench scaling_bench > "$OUT/rebuild-$1.log" 2>&1; }
measure new-1
git apply -R "$patch" && rebuild old-1 && measure old-1
git apply "$patch" && rebuild new-2 && [[ $SECONDS -lt 420 ]] && measure new-2
git apply -R "$patch" && rebuild old-2 && [[ $SECONDS -lt 500 ]] && measure old-2
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/llama-*.jsonl")):
    for r in map(json.loads, open(f)):
        print(f.split("/")[-1], r["throughput"], r["step_ms"])
PY
