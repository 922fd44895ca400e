#!/usr/bin/env bash
# Session 32 call 3 (2 x H200, main 39124ff): LLaMA-1.1B bf16 at 1 and 2 GPUs side by side in one run, libddp
# captured (ZeRO-2, bf16 units, copy engines at two GPUs) against PyTorch eager DDP, for issue 31's "never below
# PyTorch's efficiency"; then LLaMA-2-7B bf16 batch 1 captured on one GPU (the recording ran out of memory before
# 5ad1eb3; call 2's run was cut by a 100 s timeout: the 7B warm-up alone takes about 75 s). About 9 minutes.
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target scaling_bench ddprun; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
timeout 230 python3 benchmarks/scaling/run_scaling.py --build build/gpu --out "$OUT" --prefix llama-bf16-1-2 \
  --gpus 1,2 --models llama --precisions bf16 --impls libddp-graph,pytorch --copy-engine-reductions \
  --sharding gradients --param-dtype bf16 --steps 12 --warmup 4 > "$OUT/run_scaling.log" 2>&1
echo "run_scaling rc=$? at $SECONDS s"; cat "$OUT/llama-bf16-1-2.md" 2>/dev/null | head -30
left=$((580 - SECONDS))
timeout $left build/gpu/libddp/ddprun --nproc-per-node 1 --standalone build/gpu/benchmarks/scaling/scaling_bench \
  --model llama --preset llama2-7b --batch 1 --precision bf16 --cuda-graph --steps 8 --warmup 3 \
  --json "$OUT/llama2-7b.jsonl" > "$OUT/llama2-7b.log" 2>&1
echo "llama2-7b captured rc=$? at $SECONDS s (limit $left s)"; tail -c 1500 "$OUT/llama2-7b.log"
rm -f "$OUT"/*.svg
