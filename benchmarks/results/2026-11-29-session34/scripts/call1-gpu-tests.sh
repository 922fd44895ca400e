set -u
SECONDS=0
export DDP_GIT_COMMIT=$1
nvidia-smi -L
bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.out 2>&1
echo "gpu_check rc=$? at $SECONDS s"
grep -E "tests passed|tests failed|Total Test time|\(Failed\)|Timeout|\*\*\*" $OUT/ctest_gpu.log | head -20
# old-code check of the capture-end test
git diff HEAD~1 -- libddp/capture/captured_step.cpp > /tmp/ce.patch && git apply -R /tmp/ce.patch &&
  cmake --build build/gpu --target ddp_captured_gpu_tests > /tmp/b.log 2>&1 && 
  timeout 60 $(find build/gpu -name ddp_captured_gpu_tests -type f | head -1) --gtest_filter='*ARecordingThatFails*' > $OUT/old-code-capture-end.log 2>&1
echo "old code rc=$? at $SECONDS s"; tail -15 $OUT/old-code-capture-end.log
git apply /tmp/ce.patch
cd $OUT && tar czf logs.tgz *.log *.out 2>/dev/null; ls $OUT
