#!/usr/bin/env bash
# One call on one GPU (device time was short: most starts failed this session). (1) Build everything; (2) the GPU
# tests the weight casts touch and those the last session's host code left unrun: FP8, captured step, fused
# optimizers, sharding on CUDA, the LLaMA kernels and the examples (an FP8 LLaMA run killed and resumed exactly);
# (3) the new Float8WeightCast tests against two broken variants of the code they guard, each of which they must
# catch: (a) no cast again before a replay, (b) no version check (a cast taken though its weight changed in place);
# (4) if time is left, the A/B of optimizer-weight-casts.patch (in this tree) against the tree without it:
# LLaMA-1.1B captured, fp8 with fast accumulation and bf16, one round, one profiled fp8 replay each.
set -u
: "${OUT:?}"
SECONDS=0
here=benchmarks/results/2026-12-07-session35/scripts
export DDP_GIT_COMMIT=$1
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu -j "$(nproc)"; } > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "build at $SECONDS s"
(cd build/gpu && timeout 260 ctest -L gpu -R "Float8|Captured|Fused|AdamW|Sharding|Llama|ExamplesGpu|Precision" \
  --output-on-failure > "$OUT/ctest.log" 2>&1)
echo "ctest rc=$? at $SECONDS s"
grep -E "tests passed|tests failed|Total Test time|\(Failed\)|Timeout|\*\*\*" "$OUT/ctest.log" | head -20
bin=$(find build/gpu -name ddp_float8_gpu_tests -type f | head -1)
cp libddp/optim/fused_adamw.cpp libddp/float8/weight_cast.h /tmp/
sed -i 's|for (const auto& \[weight, target\] : capture_->recorded_casts) target->before_replay(weight);|(void)0;|' \
  libddp/optim/fused_adamw.cpp
sed -i 's| \&\& weight._version() == version_;|;|' libddp/float8/weight_cast.h
timeout 120 cmake --build build/gpu --target ddp_float8_gpu_tests > /tmp/broken-build.log 2>&1 || tail -20 /tmp/broken-build.log
timeout 60 $bin --gtest_filter='Float8WeightCast.*' > "$OUT/broken-variants.log" 2>&1
echo "broken variants rc=$? at $SECONDS s (must be nonzero)"; grep -E "^\[  (FAILED|     OK|  PASSED)" "$OUT/broken-variants.log" | head
cp /tmp/fused_adamw.cpp libddp/optim/fused_adamw.cpp; cp /tmp/weight_cast.h libddp/float8/weight_cast.h
timeout 120 cmake --build build/gpu --target scaling_bench ddprun > /tmp/rebuild.log 2>&1 || tail -5 /tmp/rebuild.log
if (( SECONDS < 330 )); then
  timeout $((590 - SECONDS)) bash benchmarks/scripts/ab_patch.sh $here/optimizer-weight-casts.patch --reverse --profile \
    --rounds 1 --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
    --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16"
  for trace in base patched; do
    echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
  done > "$OUT/float8-kernels.txt" 2>&1
  grep -E "adamw|Identity|direct_copy|diff ms|span" "$OUT/diff.txt" | cut -c1-170
else
  echo "no time left for the A/B at $SECONDS s"
fi
echo "done at $SECONDS s"
cd "$OUT" && tar czf logs.tgz ./*.log ./*.txt 2>/dev/null; ls
