#!/usr/bin/env bash
# Call 2c (1 GPU, warm): LLaMA-1.1B side by side (libddp eager and captured, PyTorch eager and torch.compile) in
# bf16, libddp fp8; 300-step loss curves of a small decoder, fused (two seeds) and unfused (the reference's ops).
set -u
: "${OUT:?}"
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" build_only > "$OUT/build.log" 2>&1
timeout 330 python3 benchmarks/scaling/run_scaling.py --build $B --out "$OUT" --prefix scaling-llama-bf16 --gpus 1 \
  --models llama --precisions bf16 --impls libddp,libddp-graph,pytorch,pytorch-compile --steps 20 --warmup 8 > "$OUT/scaling-llama-bf16.log" 2>&1
timeout 60 python3 benchmarks/scaling/run_scaling.py --build $B --out "$OUT" --prefix scaling-llama-fp8 --gpus 1 \
  --models llama --precisions fp8 --impls libddp --fp8-fast-accum --steps 20 --warmup 8 > "$OUT/scaling-llama-fp8.log" 2>&1
train="$B/libddp/ddprun --nproc-per-node 1 --standalone $B/examples/llama/train_llama --preset tiny --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 704 --vocab 512 --seq-len 256 --batch 16 --precision bf16 --steps 300 --warmup 20 --log-every 25 --eval-batches 4"
timeout 60 $train --seed 0 --metrics "$OUT/train-fused-seed0.jsonl" > "$OUT/train.log" 2>&1; echo "fused0 rc=$?" >> "$OUT/train.log"
timeout 60 $train --seed 0 --unfused --metrics "$OUT/train-unfused-seed0.jsonl" >> "$OUT/train.log" 2>&1; echo "unfused0 rc=$?" >> "$OUT/train.log"
timeout 60 $train --seed 1 --metrics "$OUT/train-fused-seed1.jsonl" >> "$OUT/train.log" 2>&1; echo "fused1 rc=$?" >> "$OUT/train.log"
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
cat "$OUT/scaling-llama-bf16.md" "$OUT/scaling-llama-fp8.md" 2>/dev/null | grep -E "^\|" | head -30
grep "rc=" "$OUT/train.log" | tr '\n' ' '
tail -n 4 "$OUT/train.log"
