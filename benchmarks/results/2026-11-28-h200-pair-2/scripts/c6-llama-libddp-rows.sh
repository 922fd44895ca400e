#!/usr/bin/env bash
# Session 23 call 6 (the warm H200 of call 5, whose libddp rows failed: that fresh machine had no build): build,
# then LLaMA-1.1B libddp captured rows, bf16 and fp8, beside call 5's torch.compile row of the same lease.
set -u
: "${OUT:?}"
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
for p in bf16 fp8; do
  extra=""; [[ $p == fp8 ]] && extra="--fp8-fast-accum"
  timeout 60 python3 benchmarks/scaling/run_scaling.py --build build/gpu --gpus 1 --steps 15 --warmup 5 --out "$OUT" \
    --prefix llama-$p --models llama --precisions $p $extra --impls libddp-graph > "$OUT/llama-$p.log" 2>&1
  echo "$p rc=$? at $SECONDS s"
done
cat "$OUT"/*.json "$OUT"/*.rows.jsonl 2>/dev/null | grep -o '"throughput": [0-9.]*' 
