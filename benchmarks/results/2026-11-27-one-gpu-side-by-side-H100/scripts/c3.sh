#!/usr/bin/env bash
# Session 19 call 3 (one GPU; carry .dbg/c3.sh): build; then one lease, side by side: ResNet-50 bf16 and tf32 and
# LLaMA-1.1B bf16, libddp's captured step against torch.compile + DDP.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" none > /tmp/gpu_check.log 2>&1; echo "build rc=$? at $SECONDS s"
timeout $((560 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --gpus 1 --models resnet50 --precisions bf16,tf32 \
  --impls libddp-graph,pytorch-compile --steps 12 --warmup 4 --out "$OUT" --prefix resnet-1gpu > "$OUT/resnet.log" 2>&1
echo "resnet rc=$? at $SECONDS s"; grep -E "tok/s|img/s|rror" "$OUT/resnet.log" | grep -v "^run_scaling: .*: /" | cut -c1-160
timeout $((585 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --gpus 1 --models llama --precisions bf16 \
  --impls libddp-graph,pytorch-compile --steps 12 --warmup 4 --out "$OUT" --prefix llama-1gpu > "$OUT/llama.log" 2>&1
echo "llama rc=$? at $SECONDS s"; grep -E "tok/s|img/s|rror" "$OUT/llama.log" | grep -v "^run_scaling: .*: /" | cut -c1-160
ls "$OUT"
