#!/usr/bin/env bash
# Session 17 call 1 (kind nvidia-h200-x2, main 011a0a5; carry .dbg/s17call1.sh .dbg/kdiff.py): build; profiled
# LLaMA-1.1B bf16 eager runs: plain 1 GPU, ZeRO-2 bf16 units 1 GPU, ZeRO-2 bf16 units 2 GPUs on the copy engines;
# kernel diffs between them.
set -u
: "${OUT:?}"
nvidia-smi -L
timeout 240 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/build.log" 2>&1; echo "build rc=$? at $SECONDS s"
B=build/gpu
bench="$B/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 6 --warmup 3 --json $OUT/prof.jsonl"
prof() {  # prof NAME NPROC FLAGS...
  local name=$1 n=$2; shift 2
  timeout 90 $B/libddp/ddprun --nproc-per-node "$n" --standalone $bench "$@" --profile-trace "/tmp/trace-$name.json" > "$OUT/prof-$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"; ls /tmp/trace-$name* 2>/dev/null | head -3
}
prof plain1 1
prof zero2bf16-1 1 --sharding gradients --param-dtype bf16
prof zero2bf16-2 2 --sharding gradients --param-dtype bf16 --copy-engine-reductions
t() { ls /tmp/trace-$1*.json | head -1; }
python3 .dbg/kdiff.py "$(t plain1)" "$(t zero2bf16-1)" > "$OUT/kdiff-plain1-zero2bf16-1.txt" 2>&1
python3 .dbg/kdiff.py "$(t zero2bf16-1)" "$(t zero2bf16-2)" > "$OUT/kdiff-zero2bf16-1-2.txt" 2>&1
python3 .dbg/kdiff.py "$(t plain1)" "$(t zero2bf16-2)" > "$OUT/kdiff-plain1-zero2bf16-2.txt" 2>&1
cat "$OUT"/kdiff-*.txt | cut -c1-150
python3 -c "
import json
for r in map(json.loads, open('$OUT/prof.jsonl')): print(r['gpus'], r['sharding'], r['param_dtype'], r['throughput'], r['forward_ms'], r['backward_ms'], r['optimizer_ms'], r['exposed_comm_ms'])"
for n in plain1 zero2bf16-2; do f=$(t $n); gzip -c "$f" > "$OUT/$(basename $f).gz"; done
ls -la "$OUT"
