#!/usr/bin/env bash
# Session 7, call 2 (two GPUs): build; captured-step tests (find_unused + static_graph across ranks after the
# globally-used cache); then kFull eager vs captured on 2 GPUs: throughput and peak memory (tinyllama-1.1b bf16).
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
CTEST_ARGS="-R DdpNccl.Captured|DdpNccl.Recording|CapturedStep|DdpNccl.Unused" timeout 330 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -8 | cut -c1-300
grep -E "tests passed|\*\*\*Failed|\*\*\*Timeout|\*\*\*Skipped|Exception|CMake Error" $OUT/ctest_gpu.log | head -30
grep -E "^[0-9]+: captured vs eager|differs|what\(\)|Segmentation|Failure|illegal|rank [01]" $OUT/ctest_gpu.log | sort -u | head -30 | cut -c1-400
run="build/gpu/libddp/ddprun --nproc-per-node 2 --standalone build/gpu/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4"
for mode in "--sharding full" "--sharding full --cuda-graph" "--sharding full --param-dtype bf16" "--sharding full --param-dtype bf16 --cuda-graph" "--sharding gradients" "--sharding gradients --cuda-graph"; do
  echo "== $mode"
  timeout 150 $run $mode --json $OUT/full.jsonl 2>&1 | tail -2 | cut -c1-300
done
python3 - "$OUT/full.jsonl" <<'PY'
import json,sys
for line in open(sys.argv[1]):
    r=json.loads(line)
    print(r.get("impl"), r.get("sharding"), r.get("param_dtype",""), "tok/s", r.get("throughput"), "peak GiB", r.get("peak_mem_gib"), "loss", r.get("final_loss"), "step ms", r.get("step_ms"))
PY
