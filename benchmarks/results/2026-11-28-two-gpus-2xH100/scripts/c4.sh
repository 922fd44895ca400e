#!/usr/bin/env bash
# Session 21 call 4 (2 GPUs, main 11567b5): where LLaMA fp8's captured 2-GPU step loses 4 ms. Captured runs, one
# lever at a time, 1 and 2 GPUs; then, if nsys is installed, the captured 2-GPU fp8 step's kernel timeline.
set -u
: "${OUT:?}"
nvidia-smi -L; which nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null
B=build/gpu
{ bash cmake/scripts/configure.sh python $B -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build $B -j "$(nproc)" --target scaling_bench ddprun; } > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
lb() {  # lb NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 70 $B/libddp/ddprun --nproc-per-node "$n" --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
f="--model llama --precision fp8 --fp8-fast-accum --steps 12 --warmup 4 --cuda-graph"
z="--sharding gradients --param-dtype bf16"
lb fp8-1 1 $f
lb fp8-1-zero2 1 $f $z --copy-engine-reductions
lb fp8-2-zero2-ce 2 $f $z --copy-engine-reductions
lb fp8-2-zero2-nccl 2 $f $z
lb fp8-2-zero2-ce-current 2 $f $z --copy-engine-reductions --fp8-scaling current
lb fp8-1-current 1 $f --fp8-scaling current
lb bf16-1 1 --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph
lb bf16-2-zero2-ce 2 --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph $z --copy-engine-reductions
lb fp8-2-zero2-ce-again 2 $f $z --copy-engine-reductions
lb fp8-1-again 1 $f
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["precision"], r["gpus"], r.get("sharding", "-"), r.get("fp8_scaling"), r.get("copy_engine_reductions"),
          round(r["throughput"]), r.get("step_ms"), r.get("peak_mem_gib"))
PY
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [[ -n "$nsys" && $SECONDS -lt 400 ]]; then
  timeout 150 $nsys profile -o /tmp/fp8-2 --cuda-graph-trace=node -t cuda,nvtx -f true \
    $B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench $f $z --copy-engine-reductions \
    --steps 4 --warmup 3 > "$OUT/nsys.log" 2>&1; echo "nsys rc=$? at $SECONDS s"
  timeout 60 $nsys stats -r cuda_gpu_kern_sum,cuda_gpu_trace -f csv -o /tmp/fp8-2 /tmp/fp8-2.nsys-rep > /dev/null 2>&1
  ls /tmp/fp8-2*; gzip -c /tmp/fp8-2_cuda_gpu_trace.csv > "$OUT/fp8-2-trace.csv.gz" 2>/dev/null
  head -25 /tmp/fp8-2_cuda_gpu_kern_sum.csv 2>/dev/null | cut -c1-220
fi
