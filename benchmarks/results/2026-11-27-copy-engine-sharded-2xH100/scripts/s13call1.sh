#!/bin/bash
# Session 13, call 1: build; the 2-GPU tests (copy engines incl. sharded collectives); DdpNccl over copy engines by env; the rest of -L gpu.
cd "$(dirname "$0")/.."
nvidia-smi -L > "$OUT/gpus.txt"; nvidia-smi topo -m >> "$OUT/gpus.txt"
git log --oneline -1 > "$OUT/commit.txt" 2>&1; git status --short >> "$OUT/commit.txt"
timeout 280 bash cmake/scripts/gpu_check.sh "$OUT/build" none > "$OUT/build.log" 2>&1; echo "build rc $?"
tail -3 "$OUT/build.log"
two='(CopyEngine|DdpNccl|NcclFailures|NcclCollectives)'
timeout 200 ctest --test-dir build/gpu -L gpu -R "$two" --output-on-failure --timeout 150 > "$OUT/two-gpu.log" 2>&1
grep -E "tests passed|Total Test|\*\*\*Failed|\*\*\*Timeout|Failed  " "$OUT/two-gpu.log"
DDP_COPY_ENGINE_REDUCTIONS=1 timeout 120 ctest --test-dir build/gpu -L gpu -R DdpNccl -E ShardedModesOnTheCopyEngines --output-on-failure --timeout 100 > "$OUT/ddp-nccl-env-ce.log" 2>&1
grep -E "tests passed|Total Test|\*\*\*Failed|\*\*\*Timeout|Failed  " "$OUT/ddp-nccl-env-ce.log"
timeout $((590 - SECONDS)) ctest --test-dir build/gpu -L gpu -E "$two" --output-on-failure --timeout 120 > "$OUT/one-gpu.log" 2>&1
grep -E "tests passed|Total Test|\*\*\*Failed|\*\*\*Timeout|Failed  " "$OUT/one-gpu.log"
echo "elapsed $SECONDS"
cd "$OUT" && tar czf all.tgz *.log *.txt 2>/dev/null
