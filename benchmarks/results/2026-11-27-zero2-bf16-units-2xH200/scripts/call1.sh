#!/usr/bin/env bash
# Session 16, call 1 (kind nvidia-h200-x2; run ON branch gpu-run-16 = zero2-param-dtype + cast-register-tiles;
# carry [".dbg/s16call1.sh"]): clean -Werror build, then every GPU test the two branches touch, on two GPUs
# (the one-GPU tests run too). Prints the pass count and any failure.
set -u
: "${OUT:?}"
nvidia-smi -L
CTEST_ARGS="-R (Shard|DdpNccl|Captured|Float8|Fp8|Swiglu|CopyEngine)" timeout 540 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > /tmp/gpu_check.log 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -c "warning:" "$OUT/build.log" 2>/dev/null
grep -E "tests passed|\*\*\*Failed|Failed  |Exception|Not Run" "$OUT/ctest_gpu.log" | head -20
tail -c 4000 /tmp/gpu_check.log > "$OUT/gpu_check-tail.log"
