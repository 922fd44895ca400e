#!/usr/bin/env bash
# Session 32 call 2 (2 x H200), tree = main 97c0f36 + captured-step-memory.patch + norm-backward-float8.patch (whose
# GPU tests passed with every other GPU test in call 1). 1) A/B of the norm-backward patch on one GPU: this tree
# against a copy with it reversed, LLaMA-1.1B captured fp8 (fast accumulation) and bf16, two rounds, one profiled
# fp8 replay each. 2) LLaMA-2-7B bf16 batch 1 captured (the captured-step patch empties the allocator's cache before
# recording; main ran out of memory there). 3) Meanwhile on GPU 1, the patch's new test against main's
# captured_step.cpp (the copy with the library part reversed): it must fail. 4) LLaMA-1.1B at two GPUs (ZeRO-2,
# bf16 units, copy engines), fp8 and bf16, for the efficiency against this lease's one-GPU rows. About 9 minutes.
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-pair-session32/scripts
nvidia-smi -L
bash benchmarks/scripts/ab_patch.sh $here/norm-backward-float8.patch --reverse --profile \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum" \
  --run "--model llama --steps 12 --warmup 4 --cuda-graph --precision bf16" || exit 1
for trace in base patched; do
  echo "$trace:"; python3 benchmarks/results/2026-11-29-h200-session29/scripts/float8_kernel_bandwidth.py /tmp/ab-$trace.json
done > "$OUT/float8-kernels.txt" 2>&1
base=$(ls -d /tmp/ab-norm-backward-float8-*-R)
(cd "$base" && git apply -R --include='libddp/*' "$OLDPWD/$here/captured-step-memory.patch" &&
  cmake --build build/gpu --target ddp_captured_gpu_tests > /tmp/base-test-build.log 2>&1 &&
  CUDA_VISIBLE_DEVICES=1 build/gpu/tests/ddp_captured_gpu_tests \
    --gtest_filter='CapturedStep.RecordingReleasesTheEagerStepsCachedMemory' > "$OUT/base-test.log" 2>&1
  echo "the new test against main's captured_step.cpp: rc=$? (expected non-zero) at $SECONDS s") &
B=build/gpu
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  rm -f /tmp/row.jsonl
  timeout 100 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json /tmp/row.jsonl "$@" > /tmp/run-$name.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 400 /tmp/run-$name.log | grep -iE "error|memory")"
  [[ -f /tmp/row.jsonl ]] && sed "s/^{/{\"label\": \"$name\", /" /tmp/row.jsonl >> "$OUT/rows.jsonl"
}
CUDA_VISIBLE_DEVICES=0 lb llama2-7b-captured 1 --model llama --preset llama2-7b --batch 1 --precision bf16 --cuda-graph \
  --steps 8 --warmup 3
wait
l="--model llama --steps 12 --warmup 4 --cuda-graph --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb fp8-2gpu 2 $l --precision fp8 --fp8-fast-accum
lb bf16-2gpu 2 $l --precision bf16
python3 -c 'import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["label"], round(r["throughput"]), r["step_ms"], r.get("peak_mem_gib"))' "$OUT/rows.jsonl"
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
