#!/usr/bin/env bash
# Session 21 call 1 (kind nvidia-h200-x2; main 11567b5): clean -Werror build, then every GPU test (ctest -L gpu)
# on the two GPUs. Prints the pass count and any failure.
set -u
: "${OUT:?}"
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
timeout 575 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > /tmp/gpu_check.log 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -c "warning:" "$OUT/build.log" 2>/dev/null
grep -E "tests passed|\*\*\*Failed|Failed  |Exception|Not Run|Total Test|Timeout" "$OUT/ctest_gpu.log" | head -20
grep -E "Test +#" "$OUT/ctest_gpu.log" | wc -l
grep -E "Test +#.*sec" "$OUT/ctest_gpu.log" | sort -t'=' -k2 | tail -3
tail -c 3000 /tmp/gpu_check.log > "$OUT/gpu_check-tail.log"
gzip -k "$OUT/ctest_gpu.log"; rm -f "$OUT/ctest_gpu.log"
