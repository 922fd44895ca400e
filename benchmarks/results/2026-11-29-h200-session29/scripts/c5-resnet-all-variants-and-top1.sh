#!/usr/bin/env bash
# Session 29 call 5 (one H200): issue 28's closing proof on the tree of session 29 (DDP_GIT_COMMIT given by the
# caller). ResNet-50 bf16, every variant in one lease (run_scaling: libddp captured, libddp eager, libddp with ATen's
# ops, PyTorch DDP eager, torch.compile, torch.compile with CUDA graphs); then a short training run on make_images'
# gratings, the fused path (--bn auto, captured) against ATen's ops (--bn aten) over the same 240 steps, seeds 0
# and 1, top-1 on 896 validation images (session 9's call 6 settings). About 9 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun train_resnet50 make_images > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
timeout 300 python3 benchmarks/scaling/run_scaling.py --gpus 1 --steps 20 --warmup 5 --out "$OUT" --prefix resnet-bf16-all \
  --models resnet50 --precisions bf16 \
  --impls libddp-graph,libddp,libddp-unfused,pytorch,pytorch-compile,pytorch-compile-graphs > "$OUT/resnet-bf16-all.log" 2>&1
echo "run_scaling rc=$? at $SECONDS s"; grep -E "img/s|rror" "$OUT/resnet-bf16-all.log" | cut -c1-150
b=build/gpu data=/tmp/gratings
timeout 60 $b/examples/make_images --output $data --classes 10 --train 6000 --val 1000 --size 256 > /tmp/make_images.log 2>&1
echo "make_images rc=$? at $SECONDS s"
for seed in 0 1; do
  for bn in auto aten; do
    name=gratings-$bn-seed$seed
    timeout 80 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --data $data \
      --precision bf16 --batch 128 --steps 240 --warmup 48 --lr 0.05 --log-every 40 --eval-batches 7 --seed $seed \
      --bn $bn --metrics $OUT/$name.jsonl > $OUT/$name.log 2>&1
    echo "$name rc=$? at $SECONDS s: $(grep -oE 'step 40/240 \| loss [0-9.]+' $OUT/$name.log) $(grep -oE 'step 240/240 \| loss [0-9.]+' $OUT/$name.log) $(grep -oE 'top-1 [0-9.]+%' $OUT/$name.log)"
    [[ $SECONDS -gt 500 ]] && break 2
  done
done
