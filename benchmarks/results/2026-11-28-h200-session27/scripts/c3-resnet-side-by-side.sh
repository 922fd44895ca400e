#!/usr/bin/env bash
# Session 27 call 3 (one H200): the max-pooling kernels with 32-bit indexing (tests, one profiled bf16 replay for
# the kernels' times, the device copy bandwidth for scale), then ResNet-50 side by side in one lease: libddp
# captured against torch.compile and its CUDA-graph mode, bf16 and tf32. About 8 minutes.
set -u
: "${OUT:?}"
nvidia-smi -L
[[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_resnet_gpu_tests > /tmp/build.log 2>&1
rc=$?; echo "build rc=$rc at $SECONDS s"; [[ $rc == 0 ]] || { grep -E "error|Error" /tmp/build.log | head -20; exit 1; }
B=build/gpu
(cd $B && ctest -R "ResNetKernels" --output-on-failure > "$OUT/tests.log" 2>&1); echo "tests rc=$? at $SECONDS s"
grep -E "tests passed|Failed|FAILED" "$OUT/tests.log" | head
timeout 120 $B/libddp/ddprun --nproc-per-node 1 --standalone $B/benchmarks/scaling/scaling_bench --model resnet50 \
  --steps 5 --warmup 6 --cuda-graph --precision bf16 --profile-trace /tmp/fused.json > /tmp/run.log 2>&1
echo "profile rc=$? at $SECONDS s"
python3 - <<'PY' | tee "$OUT/max-pool-kernels.txt"
import json, torch
events = json.load(open("/tmp/fused.json"))["traceEvents"]
for e in events:
    if e.get("ph") == "X" and "max_pool" in e.get("name", "") and str(e.get("cat", "")).lower() == "kernel":
        print(f"{e['dur'] / 1e3:.3f} ms  {e['name'][:110]}")
x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): y.copy_(x)
t.record(); torch.cuda.synchronize()
ms = s.elapsed_time(t) / 20
print(f"device copy of 256 MiB: {ms:.3f} ms, {2 * x.numel() / ms / 1e9:.2f} TB/s (read + write)")
PY
rs() {  # rs NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/scaling/run_scaling.py --gpus 1 --steps 20 --warmup 5 --out "$OUT" --prefix "$name" \
    "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? at $SECONDS s"; grep -E "img/s|rror" "$OUT/$name.log" | grep -v "^run_scaling: .*: /" | cut -c1-170
}
rs resnet-bf16 200 --models resnet50 --precisions bf16 --impls libddp-graph,pytorch-compile,pytorch-compile-graphs
rs resnet-tf32 $((560 - SECONDS)) --models resnet50 --precisions tf32 --impls libddp-graph,pytorch-compile,pytorch-compile-graphs
cat "$OUT"/*.json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    try: r = json.loads(l)
    except Exception: continue
    if isinstance(r, dict) and "throughput" in r: print(r.get("impl"), r["model"], r["precision"], r["gpus"], round(r["throughput"]), r.get("step_ms"))' 2>/dev/null | head
