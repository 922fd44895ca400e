#!/usr/bin/env bash
# For the next two-GPU lease (prepared in session 32; needs nvidia-h200-x2). Issue 31's rows that session 32 had no
# device time for, on main as it then is: ResNet-50 bf16 and tf32, 1 -> 2 GPUs, libddp captured (plain DDP on the
# copy engines) against PyTorch eager DDP in one run (last measured 2026-11-28: bf16 97.96-97.98%, before sessions
# 27-29 made the one-GPU step about 9% shorter), and LLaMA-1.1B fp8 1 -> 2 (ZeRO-2, bf16 units, copy engines) in the
# same lease. About 7 minutes on a fresh machine.
set -u
: "${OUT:?}"
SECONDS=0
nvidia-smi -L
{ bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 &&
  cmake --build build/gpu --target scaling_bench ddprun; } > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "build at $SECONDS s"
common="--build build/gpu --out $OUT --gpus 1,2 --copy-engine-reductions"
timeout 300 python3 benchmarks/scaling/run_scaling.py $common --prefix resnet50-1-2 --models resnet50 \
  --precisions bf16,tf32 --impls libddp-graph,pytorch --steps 20 --warmup 5 > "$OUT/resnet50.log" 2>&1
echo "run_scaling resnet50 rc=$? at $SECONDS s"; grep -E "^\| (bf16|tf32)" "$OUT/resnet50-1-2.md"
timeout 120 python3 benchmarks/scaling/run_scaling.py $common --prefix llama-fp8-1-2 --models llama --precisions fp8 \
  --fp8-fast-accum --impls libddp-graph --sharding gradients --param-dtype bf16 --steps 12 --warmup 4 \
  > "$OUT/llama-fp8.log" 2>&1
echo "run_scaling llama fp8 rc=$? at $SECONDS s"; grep -E "^\| fp8" "$OUT/llama-fp8-1-2.md"
rm -f "$OUT"/*.svg
