#!/usr/bin/env bash
# Session 26 call 4 (one H200): the prototype of AdamW over gradient pieces (adamw-segments.patch, not on main):
# the kernel sums the reduce-scatter's bf16 pieces, steps AdamW and writes the bf16 copy in one pass; its GPU test
# checks it bit for bit against ATen's fused AdamW on the summed gradient and prints both paths' times on a
# LLaMA-1.1B-sized shard. About 3 minutes. Call 5: the same with adamw-segments-vectorized.patch as argument.
set -u
: "${OUT:?}"
nvidia-smi -L
scripts=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/p && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/p
cd /tmp/p && patch -s -p1 < "$scripts/${1:-adamw-segments.patch}" || { echo "patch failed"; exit 1; }
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_adamw_segments_gpu_tests > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout 200 ctest --test-dir build/gpu -R AdamWSegments -V > "$OUT/test.log" 2>&1; echo "ctest rc=$?"
grep -E "elements:|Failure|differs|Passed|Failed|tests passed|Expected|Which is" "$OUT/test.log" | head -30
