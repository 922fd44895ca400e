#!/usr/bin/env bash
# Session 23 call 3 (one H200; the 2-GPU kind was no longer lent): the sharding GPU tests with the FP8 checkpoint
# test fixed (kFull needs its units named); cuDNN runtime fusion of ResNet-50's convolutions with BatchNorm
# statistics against ATen's convolution + a statistics pass (conv_genstats_bench), the brief shape set, then all.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_sharding_gpu_tests conv_genstats_bench > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
grep -E "error" /tmp/build.log | head -5
ctest --test-dir build/gpu -R "ShardingCuda" --output-on-failure > "$OUT/sharding-tests.log" 2>&1
echo "sharding tests rc=$? at $SECONDS s"; grep -E "Passed|Failed|exit code" "$OUT/sharding-tests.log" | head -8
B=build/gpu/benchmarks/cudnn_fusion/conv_genstats_bench
timeout 170 $B --shapes brief --candidates 1 --json "$OUT/conv-genstats-brief.jsonl" > "$OUT/conv-genstats-brief.txt" 2>&1
echo "conv bench brief rc=$? at $SECONDS s"; cut -c1-230 "$OUT/conv-genstats-brief.txt" | head -45
timeout $((585 - SECONDS)) $B --candidates 1 --json "$OUT/conv-genstats-all.jsonl" > "$OUT/conv-genstats-all.txt" 2>&1
echo "conv bench all rc=$? at $SECONDS s"; cut -c1-230 "$OUT/conv-genstats-all.txt" | tail -40
