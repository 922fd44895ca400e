#!/usr/bin/env bash
# For session 28's first one-GPU call (not run in session 27: no device time left). FusedAdamW on libddp's own
# AdamW kernel (fused-adamw-own-kernel.patch, beside this script; the one-pass kernel of session 26's prototype with
# a per-run step count, the learning rate as a number or a device tensor, and its table passed through kernel
# arguments): the patched tree's tests (the kernel against ATen's fused AdamW bit for bit; FusedAdamW against
# at::_fused_adamw_ bit for bit; the fused optimizers' and captured steps' tests), the kernel's time in one profiled
# LLaMA bf16 replay, then LLaMA-1.1B bf16 and fp8 captured at one GPU, main against patched, alternating, two
# rounds. Also the LLaMA and ResNet kernel tests, first run of session 27's shared with_pack. About 9 minutes.
set -u
: "${OUT:?}"
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi -L
mkdir -p /tmp/patched && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/patched
(cd /tmp/patched && patch -p1 -s < "$here/fused-adamw-own-kernel.patch") || { echo "patch does not apply"; exit 1; }
for tree in . /tmp/patched; do
  (cd $tree && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
     > /tmp/configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1)
  echo "$tree build rc=$? at $SECONDS s"
done
(cd /tmp/patched && cmake --build build/gpu --target ddp_adamw_segments_gpu_tests ddp_precision_gpu_tests ddp_captured_gpu_tests \
   ddp_llama_gpu_tests ddp_resnet_gpu_tests > /tmp/build-tests.log 2>&1 && cd build/gpu && \
   ctest -R "AdamWSegments|FusedAdamW|FusedOptimizers|CapturedStep|LlamaFusedOps|ResNetKernels" \
   --output-on-failure > "$OUT/tests.log" 2>&1)
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|FAILED" "$OUT/tests.log" | head
lb() {  # lb TREE NAME FLAGS...
  local tree=$1 name=$2; shift 2
  timeout 120 $tree/build/gpu/libddp/ddprun --nproc-per-node 1 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows-$name.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(grep -o '"step_ms": [0-9.]*' "$OUT/rows-$name.jsonl" | tail -1)"
}
l="--model llama --steps 12 --warmup 4 --cuda-graph"
lb /tmp/patched patched-profiled $l --precision bf16 --steps 3 --profile-trace /tmp/patched.json
python3 -c '
import json, collections
t = collections.Counter()
for e in json.load(open("/tmp/patched.json"))["traceEvents"]:
    if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel" and ("adamw" in e["name"] or "multi_tensor" in e["name"]):
        t[e["name"][:90]] += e["dur"]
for k, v in t.items(): print(f"{v / 1e3:.3f} ms  {k}")' | tee "$OUT/optimizer-kernels.txt"
for round in 1 2; do
  for p in bf16 fp8; do
    extra=$([[ $p == fp8 ]] && echo --fp8-fast-accum)
    lb . main-$p-$round $l --precision $p $extra
    lb /tmp/patched patched-$p-$round $l --precision $p $extra
  done
done
