#!/usr/bin/env bash
# Session 18 call 5 (2 GPUs; working tree = main 483febb + the fp32 grouped-heads fix and the one-line fatal errors;
# carry .dbg/c5.sh .dbg/gqa-fix.patch): build; LlamaFusedOps and ExamplesGpu tests; LLaMA-1.1B fp32/tf32 examples on
# both GPUs (fp32 ran out of memory in call 2); an out-of-memory run's error line; the new test against the old
# attention (must fail); LLaMA-2-7B ZeRO-3 bf16 units on both GPUs if time is left.
set -u
: "${OUT:?}"
nvidia-smi -L
CTEST_ARGS="-R (LlamaFusedOps|ExamplesGpu)" timeout 330 bash cmake/scripts/gpu_check.sh "$OUT" ctest_gpu > /tmp/gpu_check.log 2>&1
echo "gpu_check rc=$? at $SECONDS s"; grep -c "warning:" "$OUT/build.log"
grep -E "tests passed|\*\*\*Failed|Failed  |Not Run" "$OUT/ctest_gpu.log" | head; grep -E "fp32 step over" "$OUT/ctest_gpu.log"
B=build/gpu
for p in fp32 tf32; do
  timeout 60 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/examples/llama/train_llama --preset tinyllama-1.1b \
    --precision $p --steps 10 --warmup 5 --log-every 10 --eval-batches 1 > /tmp/ex.log 2>&1
  echo "llama $p rc=$? at $SECONDS s: $(grep -E '\[rank0\]: step 10/' /tmp/ex.log | cut -c1-120)"; grep error /tmp/ex.log | head -3
done
timeout 60 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/examples/llama/train_llama --preset tinyllama-1.1b \
  --precision fp32 --batch 64 --steps 2 > $OUT/oom.log 2>&1; echo "oom run rc=$? (lines: $(wc -l < $OUT/oom.log))"
grep -c "Exception raised from" $OUT/oom.log; grep "error" $OUT/oom.log | cut -c1-200
git apply -R .dbg/gqa-fix.patch && cmake --build $B --target ddp_llama_gpu_tests > /tmp/rebuild.log 2>&1; echo "old attention built rc=$? at $SECONDS s"
$B/tests/ddp_llama_gpu_tests --gtest_filter='*Fp32GroupedHeads*' 2>&1 | grep -E "fp32 step over|OK|FAILED" | head -4
git apply .dbg/gqa-fix.patch && cmake --build $B --target ddp_llama_gpu_tests scaling_bench > /tmp/rebuild.log 2>&1; echo "fix rebuilt rc=$? at $SECONDS s"
[[ $SECONDS -lt 300 ]] && timeout $((440 - SECONDS)) $B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench \
  --model llama --preset llama2-7b --batch 1 --precision bf16 --sharding full --param-dtype bf16 --copy-engine-reductions \
  --steps 4 --warmup 2 --json $OUT/7b.jsonl > /tmp/7b.log 2>&1; echo "7b rc=$? at $SECONDS s"; tail -c 1500 /tmp/7b.log; cat $OUT/7b.jsonl 2>/dev/null
