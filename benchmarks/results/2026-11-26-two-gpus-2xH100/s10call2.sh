#!/usr/bin/env bash
# Call 2 (2 GPUs, warm): LLaMA-1.1B 1 -> 2 GPUs side by side: libddp eager and captured, PyTorch eager and
# torch.compile in bf16; libddp fp8. SYMMETRIC=1 adds --nccl-symmetric-buckets to libddp's rows.
# Then one profiled libddp step on 2 GPUs (kernel names of the reduction).
set -u
: "${OUT:?}"
sym=(); [[ ${SYMMETRIC:-0} == 1 ]] && sym=(--nccl-symmetric-buckets)
B=build/gpu
[[ -x $B/benchmarks/scaling/scaling_bench ]] || timeout 300 bash cmake/scripts/gpu_check.sh "$OUT" build_only > "$OUT/build.log" 2>&1
timeout 430 python3 benchmarks/scaling/run_scaling.py --build $B --out "$OUT" --prefix scaling-llama-bf16 --gpus 1,2 \
  --models llama --precisions bf16 --impls libddp,libddp-graph,pytorch,pytorch-compile --steps 20 --warmup 8 "${sym[@]}" > "$OUT/scaling-llama-bf16.log" 2>&1
timeout 100 python3 benchmarks/scaling/run_scaling.py --build $B --out "$OUT" --prefix scaling-llama-fp8 --gpus 1,2 \
  --models llama --precisions fp8 --impls libddp --fp8-fast-accum --steps 20 --warmup 8 "${sym[@]}" > "$OUT/scaling-llama-fp8.log" 2>&1
timeout 45 $B/libddp/ddprun --nproc-per-node 2 --standalone $B/benchmarks/scaling/scaling_bench --model llama --precision bf16 \
  --steps 3 --warmup 4 "${sym[@]}" --profile-trace "$OUT/trace-2gpu.json" > "$OUT/trace.log" 2>&1
python3 - "$OUT/trace-2gpu.json" > "$OUT/trace-nccl-kernels.txt" 2>&1 <<'PY'
import json, sys, collections
events = json.load(open(sys.argv[1]))
events = events.get("traceEvents", events) if isinstance(events, dict) else events
total = collections.Counter(); count = collections.Counter()
for e in events:
    name = e.get("name", "")
    if e.get("cat") == "kernel" and ("nccl" in name.lower() or "symk" in name.lower()):
        total[name[:90]] += e.get("dur", 0); count[name[:90]] += 1
for name, us in total.most_common(12):
    print(f"{us/1000:8.2f} ms {count[name]:5d}x {name}")
PY
gzip -f "$OUT/trace-2gpu.json"
tar czf "$OUT/all.tgz" -C "$OUT" --exclude all.tgz .
cat "$OUT/scaling-llama-bf16.md" "$OUT/scaling-llama-fp8.md" 2>/dev/null | grep -E "^\|" | head -30
cat "$OUT/trace-nccl-kernels.txt"
