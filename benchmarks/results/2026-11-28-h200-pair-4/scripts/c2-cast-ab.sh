#!/usr/bin/env bash
# Session 25 call 2 (2 x H200): the masters' casts of ZeRO-2's bf16 units queued per bucket before its gather, a
# deferred unit's on a side stream (780a3d0), against the tree without it (A: cast-before-each-gather.patch
# reversed), built side by side. The GPU tests that run that path; LLaMA-1.1B fp8 and bf16 on 2 GPUs (captured,
# ZeRO-2 with bf16 units, copy engines) alternating A/B; the plain one-GPU fp8 row for the efficiency.
set -u
: "${OUT:?}"
nvidia-smi -L
here=$(pwd)
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
cmake --build build/gpu --target scaling_bench ddprun ddp_ddp_nccl_tests ddp_captured_gpu_tests ddp_sharding_gpu_tests \
  ddp_float8_gpu_tests > /tmp/build.log 2>&1
echo "build B rc=$? at $SECONDS s"; grep -E "error" /tmp/build.log | head -5
# Tree A: the same files without the change, built while B's tests run.
mkdir -p /tmp/a && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/a
( cd /tmp/a && patch -s -R -p1 < "$here/benchmarks/results/2026-11-28-h200-pair-4/scripts/cast-before-each-gather.patch" \
  && bash cmake/scripts/configure.sh python build/gpu -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure-a.log 2>&1 \
  && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build-a.log 2>&1; echo "build A rc=$?" > /tmp/build-a.rc ) &
timeout 200 ctest --test-dir build/gpu -R "DdpNccl\.(Sharded|CapturedStep|Join)|CapturedStep\.|ShardingCuda|Float8Cast\." \
  --output-on-failure > "$OUT/tests.log" 2>&1
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|exit code" "$OUT/tests.log" | head -12
wait; cat /tmp/build-a.rc; echo "at $SECONDS s"
lb() {  # lb NAME TREE NPROC FLAGS...
  local name=$1 tree=$2 n=$3; shift 3
  timeout 60 $tree/build/gpu/libddp/ddprun --nproc-per-node "$n" --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json /tmp/rows/$name.jsonl "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -c 300 /tmp/run.log | grep -i error)"
}
mkdir -p /tmp/rows
l="--model llama --steps 12 --warmup 4 --cuda-graph"
c="$l --copy-engine-reductions --sharding gradients --param-dtype bf16"
lb fp8-plain-1gpu "$here" 1 $l --precision fp8 --fp8-fast-accum
for round in 1 2; do
  lb fp8-B-$round "$here" 2 $c --precision fp8 --fp8-fast-accum
  lb fp8-A-$round /tmp/a 2 $c --precision fp8 --fp8-fast-accum
  lb bf16-B-$round "$here" 2 $c --precision bf16
  lb bf16-A-$round /tmp/a 2 $c --precision bf16
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
with open(sys.argv[1] + "/rows.jsonl", "w") as out:
    for path in sorted(glob.glob("/tmp/rows/*.jsonl"), key=os.path.getmtime):
        for line in open(path):
            if not line.strip(): continue
            r = dict(json.loads(line), label=os.path.basename(path)[:-6])
            out.write(json.dumps(r) + "\n")
            print(r["label"], r.get("precision"), r.get("gpus"), r.get("sharding", "-"), round(r.get("throughput") or 0), r.get("step_ms"),
                  str(r.get("error", ""))[:100])
PY
