#!/usr/bin/env bash
# For the next one-GPU call (prepared in session 31, not run: no device time left). LLaMA-2-7B's captured step ran
# out of memory while recording on one H200 (call 3: 105 GiB allocated, 33.5 GiB cached by the eager steps, which
# the caching allocator does not free while a capture is under way). captured-step-memory.patch (beside this
# script): CapturedStep empties the cache before recording, and an out-of-memory recording names memory, not host
# syncs, as the cause. Its test CapturedStep.RecordingReleasesTheEagerStepsCachedMemory caps the process at the
# eager steps' reservation plus half a 1 GiB scratch tensor: it must pass in the patched tree and fail in main's.
# Then LLaMA-2-7B bf16 batch 1 captured in both trees (main's is expected to fail as in call 3). About 8 minutes.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session31/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/captured-step-memory.patch --rounds 1 --tests "CapturedStep" \
  --test-targets "ddp_captured_gpu_tests" \
  --run "--model llama --preset llama2-7b --batch 1 --precision bf16 --cuda-graph --steps 8 --warmup 3"
# The new test against main's CapturedStep: it should fail there.
git apply --include='tests/*' $here/captured-step-memory.patch && cmake --build build/gpu --target ddp_captured_gpu_tests \
  > /tmp/base-test-build.log 2>&1 && build/gpu/tests/ddp_captured_gpu_tests \
  --gtest_filter='CapturedStep.RecordingReleasesTheEagerStepsCachedMemory' > "$OUT/base-test.log" 2>&1
echo "the new test in main's tree: rc=$? (expected non-zero)"
git apply -R --include='tests/*' $here/captured-step-memory.patch
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
