#!/usr/bin/env bash
# Session 29 call 7 (one H200, the warm machine of call 5: its build and /tmp/gratings): call 5's training runs for
# seeds 2-4 (about 75 s).
b=build/gpu; data=/tmp/gratings
for seed in 2 3 4; do for bn in auto aten; do name=gratings-$bn-seed$seed; timeout 40 $b/libddp/ddprun --nproc-per-node 1 --standalone $b/examples/resnet50/train_resnet50 --data $data --precision bf16 --batch 128 --steps 240 --warmup 48 --lr 0.05 --log-every 40 --eval-batches 7 --seed $seed --bn $bn --metrics $OUT/$name.jsonl > /tmp/$name.log 2>&1; echo "$name rc=$? at $SECONDS s: $(grep -oE 'step 40/240 \| loss [0-9.]+' /tmp/$name.log) $(grep -oE 'step 240/240 \| loss [0-9.]+' /tmp/$name.log) $(grep -oE 'top-1 [0-9.]+%' /tmp/$name.log)"; done; done
