#!/usr/bin/env bash
# Call 3 (2 GPUs, warm): ResNet-50 1 -> 2 GPUs side by side, bf16 and tf32: libddp eager and captured, PyTorch
# eager and torch.compile. SYMMETRIC=1 adds --nccl-symmetric-buckets to libddp's rows.
set -u
: "${OUT:?}"
sym=(); [[ ${SYMMETRIC:-0} == 1 ]] && sym=(--nccl-symmetric-buckets)
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" build_only > "$OUT/build.log" 2>&1
timeout 560 python3 benchmarks/scaling/run_scaling.py --build $B --out "$OUT" --prefix scaling-resnet50 --gpus 1,2 \
  --models resnet50 --precisions bf16,tf32 --impls libddp,libddp-graph,pytorch,pytorch-compile --steps 15 --warmup 6 "${sym[@]}" > "$OUT/scaling-resnet50.log" 2>&1
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
grep -E "^\|" "$OUT/scaling-resnet50.md" | head -30
