#!/usr/bin/env bash
# Session 18 call 1 (kind nvidia-h200-x2; main 483febb; carry .dbg/c1.sh): clean -Werror build, then every GPU test
# (ctest -L gpu) on the two GPUs. Prints the pass count and any failure.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 570 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > /tmp/gpu_check.log 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -c "warning:" "$OUT/build.log" 2>/dev/null
grep -E "tests passed|\*\*\*Failed|Failed  |Exception|Not Run|Total Test" "$OUT/ctest_gpu.log" | head -20
grep -E "Test +#" "$OUT/ctest_gpu.log" | wc -l
tail -c 3000 /tmp/gpu_check.log > "$OUT/gpu_check-tail.log"
gzip -k "$OUT/ctest_gpu.log"; rm -f "$OUT/ctest_gpu.log"
