#!/usr/bin/env bash
# Session 17 call 3 (kind nvidia-h200-x2, ~270 s of device time left; carry .dbg/s17call3.sh .dbg/cast-beside.patch):
# build only libddp, ddprun and scaling_bench; A/B of the units' casts beside the forward: LLaMA-1.1B bf16 captured,
# ZeRO-2 with bf16 units on the copy engines, new tree then old (patch reverse-applied, scaling_bench rebuilt).
set -u
: "${OUT:?}"
B=build/gpu
bash cmake/scripts/configure.sh python $B -DDDP_WARNINGS_AS_ERRORS=ON -DDDP_PRECOMPILED_HEADERS=OFF > "$OUT/configure.log" 2>&1
cmake --build $B -j "$(nproc)" --target ddprun scaling_bench > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --cuda-graph --json $OUT/rows.jsonl"
zero2="--sharding gradients --param-dtype bf16 --copy-engine-reductions"
timeout 40 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench $zero2 > "$OUT/new.log" 2>&1; echo "new rc=$? at $SECONDS s"
git apply -R .dbg/cast-beside.patch && cmake --build $B -j "$(nproc)" --target scaling_bench > "$OUT/rebuild.log" 2>&1; echo "old built rc=$? at $SECONDS s"
timeout 40 $B/libddp/ddprun --nproc-per-node 2 --standalone $bench $zero2 > "$OUT/old.log" 2>&1; echo "old rc=$? at $SECONDS s"
python3 -c "
import json
for r in map(json.loads, open('$OUT/rows.jsonl')): print(r['gpus'], r['sharding'], r['param_dtype'], r['throughput'], r['step_ms'], r['final_loss'])"
