#!/usr/bin/env bash
# Session 12 call 1 (2 GPUs): compute-interference probe (no build), then build and the exact-resume checks
# after a killed rank (LLaMA tiny bf16, captured step, plain DDP with a whole checkpoint and ZeRO-3 with a
# sharded one). Usage: OUT=... bash .dbg/s12call1.sh
set -u
: "${OUT:?}"
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpus.csv"
env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort > "$OUT/env.txt"
timeout 120 python3 benchmarks/allreduce/compute_interference.py --rounds 7 --json "$OUT/interference.jsonl" > "$OUT/interference.log" 2>&1
echo "interference rc=$?" >> "$OUT/interference.log"
timeout 330 bash cmake/scripts/gpu_check.sh "$OUT" none > "$OUT/build.log" 2>&1
echo "build rc=$?" >> "$OUT/build.log"
B=build/gpu
base="--preset tiny --precision bf16 --batch 8 --warmup 5 --lr 3e-3 --eval-batches 2 --log-every 1 --steps 60"
for mode in none:whole full:sharded; do
  sh=${mode%%:*}; fmt=${mode#*:}
  timeout 100 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/examples/llama/train_llama $base --sharding $sh \
    --metrics "$OUT/straight-$sh.jsonl" > "$OUT/straight-$sh.log" 2>&1; echo "straight $sh rc=$?" >> "$OUT/resume.txt"
  timeout 150 $B/libddp/ddprun --nproc-per-node 2 --standalone --max-restarts 1 $B/examples/llama/train_llama $base \
    --sharding $sh --metrics "$OUT/resumed-$sh.jsonl" --checkpoint "$OUT/ckpt-$sh" --checkpoint-format $fmt \
    --checkpoint-every 20 --resume --fail-at-step 30 > "$OUT/resumed-$sh.log" 2>&1
  echo "resumed $sh rc=$?" >> "$OUT/resume.txt"
  python3 - "$OUT" "$sh" >> "$OUT/resume.txt" <<'PY'
import json, sys
out, sh = sys.argv[1:]
def losses(p):
    rows = {}
    for line in open(p):
        r = json.loads(line)
        if "loss" in r and "step" in r: rows[r["step"]] = r["loss"]
    return rows
a, b = losses(f"{out}/straight-{sh}.jsonl"), losses(f"{out}/resumed-{sh}.jsonl")
common = sorted(set(a) & set(b))
print(sh, "steps", len(a), len(b), "max |diff|", max(abs(a[s] - b[s]) for s in common) if common else None,
      "at 10/30/60:", [(a.get(s), b.get(s)) for s in (10, 30, 60)])
PY
done
rm -rf "$OUT"/ckpt-*
grep -h -E "aborting|resumed from|restart" "$OUT"/resumed-*.log | head -10 >> "$OUT/resume.txt"
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
cat "$OUT/interference.log" | tail -4
tail -2 "$OUT/build.log"
cat "$OUT/resume.txt"
