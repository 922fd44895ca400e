#!/usr/bin/env bash
# For the call after the two prepared patches have run and landed (or not): LLaMA-1.1B side by side on one GPU
# (bf16: libddp captured, torch.compile; fp8: libddp captured) and LLaMA-2-7B bf16 batch 1 captured and eager, on
# main as it then is. About 7 minutes on a fresh machine (build 100 s, compile's row about 170 s).
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target scaling_bench ddprun; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
common="--build build/gpu --out $OUT --gpus 1 --models llama --steps 20 --warmup 5"
timeout 220 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-bf16 --precisions bf16 \
  --impls libddp-graph,pytorch-compile > /tmp/bf16.log 2>&1
echo "run_scaling bf16 rc=$? at $SECONDS s"
timeout 60 python3 benchmarks/scaling/run_scaling.py $common --prefix side-by-side-fp8 --precisions fp8 \
  --fp8-fast-accum --impls libddp-graph > /tmp/fp8.log 2>&1
echo "run_scaling fp8 rc=$? at $SECONDS s"
for mode in --cuda-graph ""; do
  timeout 95 build/gpu/libddp/ddprun --nproc-per-node 1 --standalone build/gpu/benchmarks/scaling/scaling_bench \
    --model llama --preset llama2-7b --batch 1 --precision bf16 $mode --steps 8 --warmup 3 \
    --json "$OUT/llama2-7b.jsonl" > /tmp/7b.log 2>&1
  echo "llama2-7b ${mode:-eager} rc=$? at $SECONDS s"; tail -3 /tmp/7b.log
done
rm -f "$OUT"/*.svg
