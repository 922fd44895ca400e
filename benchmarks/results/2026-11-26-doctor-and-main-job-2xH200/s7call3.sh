#!/usr/bin/env bash
# Session 7, call 3 (two GPUs): the main job as a user runs it (bash cmake/scripts/main.sh: build + TinyLlama-1.1B
# on the Python standard library's text, byte-level), then ddprun --doctor (text and JSON), then the kFull
# param_dtype bf16 eager vs captured loss check with equal step counts.
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
start=$SECONDS
timeout 420 bash cmake/scripts/main.sh > $OUT/main-job.log 2>&1
echo "main.sh rc=$? after $((SECONDS-start)) s"
grep -E "warning:|error:" $OUT/main-job.log | head -5 | cut -c1-300
grep -vE "^\[[0-9]+/[0-9]+\]|^-- " $OUT/main-job.log | head -12 | cut -c1-300
echo ...
tail -14 $OUT/main-job.log | cut -c1-300
b=build/main-python
cmake --build $b --target ddp_doctor_probe scaling_bench > $OUT/build-extra.log 2>&1; echo "extra build rc=$?"
grep -E "warning:|error:" $OUT/build-extra.log | head -5 | cut -c1-300
echo "== doctor"
$b/libddp/ddprun --doctor > $OUT/doctor.txt 2>&1; echo "doctor rc=$?"; cat $OUT/doctor.txt | cut -c1-400
$b/libddp/ddprun --doctor --json > $OUT/doctor.json 2>&1; echo "doctor --json rc=$?"
python3 -c "import json,sys; d=json.load(open('$OUT/doctor.json')); print('json ok', d['ok'], d['failures'], d['warnings'], len(d['checks']))"
echo "== doctor with a bad interface"
NCCL_SOCKET_IFNAME=nosuchif0 $b/libddp/ddprun --doctor 2>&1 | grep -E "NCCL_SOCKET|problem" | cut -c1-300
run="$b/libddp/ddprun --nproc-per-node 2 --standalone $b/benchmarks/scaling/scaling_bench --model llama --precision bf16 --steps 12 --warmup 4 --sharding full"
for mode in "--param-dtype bf16" "--param-dtype bf16 --cuda-graph" "" "--cuda-graph"; do
  timeout 150 $run $mode --json $OUT/full.jsonl > /dev/null 2>&1; echo "rc=$? $mode"
done
python3 - "$OUT/full.jsonl" <<'PY'
import json,sys
for line in open(sys.argv[1]):
    r=json.loads(line)
    print(r["impl"], r["sharding"], r["param_dtype"], "warmup", r["warmup"], "tok/s", r["throughput"], "peak GiB", r["peak_mem_gib"], "loss", r["final_loss"])
PY
