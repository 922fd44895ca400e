#!/usr/bin/env bash
# Session 19 call 1 (2 GPUs; carry .dbg/c1.sh): build; the GPU example tests and LLaMA fused-op tests not yet run
# on a GPU; then LLaMA-1.1B bf16 1 -> 2 GPUs side by side: libddp captured (copy engines, ZeRO-2 bf16 units),
# PyTorch eager DDP, torch.compile + DDP.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
grep -c "warning:" "$OUT/build.log"
timeout 200 ctest --test-dir build/gpu -L gpu -R "(ExamplesGpu|LlamaFusedOps)" --output-on-failure > "$OUT/ctest.log" 2>&1
echo "ctest rc=$? at $SECONDS s"; grep -E "Test +#|tests passed|Failed" "$OUT/ctest.log" | head -20
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --gpus 1,2 --models llama --precisions bf16 \
  --impls libddp-graph,pytorch,pytorch-compile --copy-engine-reductions --sharding gradients --param-dtype bf16 \
  --steps 12 --warmup 4 --out "$OUT" --prefix llama-compile-2gpu > "$OUT/scaling.log" 2>&1
echo "scaling rc=$? at $SECONDS s"; tail -25 "$OUT/scaling.log"
ls "$OUT"
