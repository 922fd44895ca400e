#!/usr/bin/env bash
# Call 2a (1 GPU): configure, build, every GPU test.
set -u
: "${OUT:?}"
timeout 560 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?" >> "$OUT/gpu_check.log"
tail -n 3 "$OUT/gpu_check.log"
grep -E "tests passed|Total Test" "$OUT/ctest_gpu.log" | head -5
grep -E "\*\*\*Failed|\*\*\*Timeout|Exception" "$OUT/ctest_gpu.log" | head -20
grep -E "weight gradient error|add_rms_norm|cross_entropy|decoder:" "$OUT/ctest_gpu.log" | head -40
