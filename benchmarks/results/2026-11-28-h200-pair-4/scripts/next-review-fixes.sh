#!/usr/bin/env bash
# For the next session with device time, on nvidia-h200-x2 if lent: the GPU tests of the path 29b6b2b changed after
# session 25's call 2 (ShardedParameters' side stream taken once from the high-priority pool, only when a deferred
# unit has a master; the loaders settling every bucket before writing; Float8Cast.ColumnRangesOfWiderMatrices's
# wider checks), which call 4 may only partly have held. About 4 minutes (build 80 s, tests ~130 s).
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_ddp_nccl_tests ddp_captured_gpu_tests ddp_sharding_gpu_tests ddp_float8_gpu_tests \
  > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
timeout 300 ctest --test-dir build/gpu -R "DdpNccl\.(Sharded|CapturedStep|Join)|CapturedStep\.|ShardingCuda|Float8Cast\." \
  --output-on-failure > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|exit code" "$OUT/tests.log" | head -12
