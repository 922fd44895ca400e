#!/usr/bin/env bash
# Session 27 call 5 (one H200): the max-pooling kernels with one thread per pack (no grid-stride loop) (tests, the
# kernels' times in one profiled replay against the lease's copy bandwidth), then ResNet-50 bf16 libddp captured
# against torch.compile's CUDA-graph mode in one run. About 5 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
[[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_resnet_gpu_tests > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
B=build/gpu
(cd $B && ctest -R "ResNetKernels" --output-on-failure > "$OUT/tests.log" 2>&1); echo "tests rc=$? at $SECONDS s"
grep -E "tests passed|Failed|FAILED" "$OUT/tests.log" | head
timeout 120 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model resnet50 \
  --steps 5 --warmup 6 --cuda-graph --precision bf16 --profile-trace /tmp/fused.json > /tmp/run.log 2>&1
echo "profile rc=$? at $SECONDS s"
python3 "$(dirname "$0")/max_pool_kernel_times.py" /tmp/fused.json | tee "$OUT/max-pool-kernels.txt"
timeout 240 python3 benchmarks/scaling/run_scaling.py --gpus 1 --steps 20 --warmup 5 --out "$OUT" --prefix resnet-bf16 \
  --models resnet50 --precisions bf16 --impls libddp-graph,pytorch-compile-graphs > "$OUT/resnet-bf16.log" 2>&1
echo "side by side rc=$? at $SECONDS s"; grep -E "img/s|rror" "$OUT/resnet-bf16.log" | grep -v "^run_scaling: .*: /" | cut -c1-170
