#!/usr/bin/env bash
# For the next session with device time, on nvidia-h200-x2 if lent (one H200 otherwise: the 2-GPU tests then skip):
# every GPU test at the current main (issue 31, item 1), among them what session 24 changed after its last device
# call: the refactored Float8Swiglu comparisons (8c09d0a), ddp::first_line_of (d15f7f5), and the FP8 skip helper
# (b6081a4). About 9 minutes on two GPUs (build 2.5 min, tests 6.3 min on 2026-11-28's H100 pair).
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 590 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > /tmp/gpu_check.log 2>&1
echo "gpu_check rc=$? at $SECONDS s"
grep -E "tests passed|\*\*\*Failed|Failed  |Exception|Not Run|Total Test|Timeout" "$OUT/ctest_gpu.log" | head -20
tail -c 3000 /tmp/gpu_check.log > "$OUT/gpu_check-tail.log"
gzip -k "$OUT/ctest_gpu.log"; rm -f "$OUT/ctest_gpu.log"
