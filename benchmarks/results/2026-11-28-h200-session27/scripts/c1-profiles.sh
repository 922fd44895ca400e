#!/usr/bin/env bash
# Session 27 call 1 (one H200): profiled captured replays of ResNet-50 (bf16, tf32) and LLaMA-1.1B (bf16, fp8 fast
# accumulation) at one GPU, traces gzipped into OUT for a kernel-by-category split read off the device; each
# workload's tok/s or img/s row beside it. About 5 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
[[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"
B=build/gpu
lb() {  # lb NAME FLAGS...
  local name=$1; shift
  timeout 120 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" --profile-trace /tmp/$name.json > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
  gzip -c /tmp/$name.json > "$OUT/$name.json.gz"
}
lb resnet-bf16 --model resnet50 --steps 20 --warmup 5 --cuda-graph --precision bf16
lb resnet-tf32 --model resnet50 --steps 20 --warmup 5 --cuda-graph --precision tf32
lb llama-bf16 --model llama --steps 12 --warmup 4 --cuda-graph --precision bf16
lb llama-fp8 --model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum
python3 benchmarks/scaling/kernel_diff.py --labels bf16,fp8 --top 40 --gaps 8 --width 110 /tmp/llama-bf16.json /tmp/llama-fp8.json > "$OUT/diff-llama.txt" 2>&1
python3 benchmarks/scaling/kernel_diff.py --labels bf16,tf32 --top 40 --gaps 8 --width 110 /tmp/resnet-bf16.json /tmp/resnet-tf32.json > "$OUT/diff-resnet.txt" 2>&1
cut -c1-200 "$OUT/rows.jsonl"
