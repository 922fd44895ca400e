#!/usr/bin/env bash
# Session 23 call 4 (one H200): LLaMA's q/k/v projections as one layer (LlamaConfig::fused_qkv) with the split and
# rotary embedding in one kernel each way (llama::ops::split_rotate_qkv): the GPU tests (the fused op against ATen's,
# the whole decoder fused against unfused, and the sharding tests with the FP8 checkpoint test), then the A/B of
# the fusion alone, LLaMA-1.1B captured, bf16 and fp8, alternating with --unfuse qkv (Meta's three layers).
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target ddp_sharding_gpu_tests ddp_llama_gpu_tests scaling_bench ddprun > /tmp/build.log 2>&1
echo "build rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
ctest --test-dir build/gpu -R "ShardingCuda|LlamaFusedOps" --output-on-failure > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "Passed|Failed|exit code" "$OUT/tests.log" | head -20
grep -E "split_rotate_qkv|decoder:" "$OUT/tests.log" | head -12
B=build/gpu
lb() {  # lb NAME FLAGS...
  local name=$1; shift
  timeout 90 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" --model llama --steps 15 --warmup 6 --cuda-graph "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
for round in 1 2; do
  lb bf16-fused --precision bf16
  lb bf16-three --precision bf16 --unfuse qkv
done
for round in 1 2; do
  [[ $SECONDS -gt 470 ]] && break
  lb fp8-fused --precision fp8 --fp8-fast-accum
  lb fp8-three --precision fp8 --fp8-fast-accum --unfuse qkv
done
python3 - "$OUT" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1] + "/rows.jsonl")):
    print(r["precision"], "unfuse=" + str(r.get("unfuse")), round(r["throughput"]), "tok/s", r.get("step_ms"), "ms",
          "fwd/bwd", r.get("forward_ms"), r.get("backward_ms"), "peak", r.get("peak_mem_gib"))
PY
