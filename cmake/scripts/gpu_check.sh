#!/usr/bin/env bash
# Everything the GPU machine has to show, in one call on a bare machine:
# configure against its python3 torch and NCCL, build, run the GPU tests,
# the smoke job and the benchmarks. Logs and results go to the directory given.
#   bash cmake/scripts/gpu_check.sh OUT_DIR [STEP...]
# STEPs (default: all): ctest_gpu smoke allreduce ddp_overlap ddp_overlap_no_timeline precision fp8_recipes
#   fp8_throughput fused_kernels sharding checkpoints examples scaling profile
# EXAMPLE_GPUS (default: gpu, all of them) and EXAMPLE_STEPS (default 20) set the examples' runs;
# SHARDING_PRESETS (default tinyllama-1.1b), SHARDING_PRECISIONS (default bf16 fp8), SHARDING_MODES (default
# none optimizer gradients full full-bf16, the last with --param-dtype bf16), SHARDING_ROUNDS (default 2),
# SHARDING_GPUS (default 1) and SHARDING_ARGS (more scaling_bench flags) the sharding step's;
# SCALING_ARGS adds run_scaling.py flags (--gpus 1,2 --models llama ...).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [STEP...]}
shift
wanted=("$@")
mkdir -p "$out"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# "-dirty" where the tracked files differ from HEAD (a copied tree with older git metadata, uncommitted changes).
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-$(git describe --always --dirty --exclude='*' 2>/dev/null || echo unknown)}
status=0
step() {  # step NAME COMMAND...: runs, logs to OUT/NAME.log, remembers failure
  local name=$1; shift
  if ((${#wanted[@]})) && [[ $name != configure && $name != build && " ${wanted[*]} " != *" $name "* ]]; then return; fi
  echo "== $name: $*"
  "$@" > >(tee "$out/$name.log") 2>&1 || { echo "!! $name failed"; status=1; }
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpus.csv" 2>&1
echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-<unset>} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-<unset>}"
step configure bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DDDP_PRECOMPILED_HEADERS=OFF
step build cmake --build build/gpu -j "$(nproc)"
step ctest_gpu ctest --test-dir build/gpu -L gpu --output-on-failure --verbose ${CTEST_ARGS:-}  # e.g. CTEST_ARGS="-R Sharding"
step smoke build/gpu/libddp/ddprun --nproc-per-node gpu --standalone build/gpu/examples/smoke/collectives_smoke
step allreduce build/gpu/libddp/ddprun --nproc-per-node gpu --standalone build/gpu/benchmarks/allreduce/allreduce_bench \
  --json "$out/allreduce.json" --markdown "$out/allreduce.md"
step ddp_overlap build/gpu/libddp/ddprun --nproc-per-node gpu --standalone build/gpu/benchmarks/ddp_overlap/ddp_overlap \
  --json "$out/ddp_overlap.json" --markdown "$out/ddp_overlap.md"
step ddp_overlap_no_timeline build/gpu/libddp/ddprun --nproc-per-node gpu --standalone \
  build/gpu/benchmarks/ddp_overlap/ddp_overlap --no-timeline \
  --json "$out/ddp_overlap_no_timeline.json" --markdown "$out/ddp_overlap_no_timeline.md"
step precision build/gpu/benchmarks/precision/precision_bench --json "$out/precision.json" --markdown "$out/precision.md"
# LLaMA in FP8 under both recipes on one GPU: tinyllama-1.1b's throughput against
# bf16, and a short training run of a small decoder (loss against bf16's).
fp8_recipes() {
  local run="build/gpu/libddp/ddprun --nproc-per-node 1 --standalone" p scaling rc=0
  : > "$out/fp8-recipes-throughput.jsonl"
  for p in bf16 fp8:current fp8:delayed; do
    scaling=${p#*:}; [[ $p == bf16 ]] && scaling=delayed
    $run build/gpu/benchmarks/scaling/scaling_bench --model llama --precision ${p%%:*} --fp8-scaling $scaling \
      --json "$out/fp8-recipes-throughput.jsonl" || rc=1
    $run build/gpu/examples/llama/train_llama --preset tiny --dim 256 --layers 4 --heads 4 --kv-heads 4 --ffn 704 \
      --vocab 512 --seq-len 256 --batch 16 --precision ${p%%:*} --fp8-scaling $scaling --steps ${FP8_TRAIN_STEPS:-300} \
      --warmup 20 --log-every 50 --eval-batches 4 --metrics "$out/fp8-recipes-train-${p/:/-}.jsonl" || rc=1
  done
  return $rc
}
step fp8_recipes fp8_recipes
# tinyllama-1.1b on one GPU in bf16, fp8 and fp8 with fast accumulation, alternating for
# FP8_ROUNDS rounds (default 2), so that each ratio to bf16 comes from one machine and minute.
fp8_throughput() {
  local round p rc=0
  : > "$out/fp8-throughput.jsonl"
  for ((round = 0; round < ${FP8_ROUNDS:-2}; ++round)); do
    for p in bf16 fp8 fp8:--fp8-fast-accum; do
      # shellcheck disable=SC2086
      build/gpu/libddp/ddprun --nproc-per-node 1 --standalone build/gpu/benchmarks/scaling/scaling_bench --model llama \
        --precision ${p%%:*} $([[ $p == *:* ]] && echo "${p#*:}") --json "$out/fp8-throughput.jsonl" || rc=1
    done
  done
  return $rc
}
step fp8_throughput fp8_throughput
# tinyllama-1.1b on one GPU with the fused RMSNorm / RoPE / SwiGLU kernels and
# with the ATen ops PyTorch's reference runs, bf16 and fp8.
fused_kernels() {
  local p variant rc=0
  : > "$out/fused-kernels.jsonl"
  for p in bf16 fp8; do
    for variant in --unfused ""; do
      # shellcheck disable=SC2086
      build/gpu/libddp/ddprun --nproc-per-node 1 --standalone build/gpu/benchmarks/scaling/scaling_bench --model llama \
        --precision $p $variant --json "$out/fused-kernels.jsonl" || rc=1
    done
  done
  return $rc
}
step fused_kernels fused_kernels
# LLaMA on one GPU in each sharding mode, alternating for SHARDING_ROUNDS rounds, so
# that each mode's cost against plain DDP comes from one machine and minute; then
# a short ZeRO-3 training run of the small decoder on every GPU (the loss must fall).
sharding() {
  local preset precision round mode rc=0
  : > "$out/sharding-throughput.jsonl"
  for preset in ${SHARDING_PRESETS:-tinyllama-1.1b}; do
    for precision in ${SHARDING_PRECISIONS:-bf16 fp8}; do
      for ((round = 0; round < ${SHARDING_ROUNDS:-2}; ++round)); do
        for mode in ${SHARDING_MODES:-none optimizer gradients full full-bf16}; do
          # shellcheck disable=SC2086
          build/gpu/libddp/ddprun --nproc-per-node ${SHARDING_GPUS:-1} --standalone build/gpu/benchmarks/scaling/scaling_bench \
            --model llama --preset $preset $([[ $preset == llama2-7b ]] && echo --batch 1) --precision $precision \
            --sharding ${mode%-bf16} --param-dtype $([[ $mode == *-bf16 ]] && echo bf16 || echo fp32) \
            --json "$out/sharding-throughput.jsonl" ${SHARDING_ARGS:-} || rc=1
        done
      done
    done
  done
  build/gpu/libddp/ddprun --nproc-per-node gpu --standalone build/gpu/examples/llama/train_llama --preset tiny \
    --sharding full --steps 100 --log-every 20 --eval-batches 2 --metrics "$out/sharding-train-tiny.jsonl" || rc=1
  return $rc
}
step sharding sharding
# Checkpoints of tinyllama-1.1b in ZeRO-3 on every GPU, whole and sharded: the save and load
# times the trainer prints, and the losses of a run resumed from each (CHECKPOINT_DIR, default /tmp).
checkpoints() {
  local format dir rc=0 run="build/gpu/libddp/ddprun --nproc-per-node gpu --standalone build/gpu/examples/llama/train_llama"
  for format in whole sharded; do
    dir=${CHECKPOINT_DIR:-/tmp}/ddp-checkpoint-$format
    rm -rf "$dir"
    $run --preset tinyllama-1.1b --sharding full --steps 2 --warmup 1 --log-every 1 --checkpoint "$dir" \
      --checkpoint-format $format --metrics "$out/checkpoint-$format-first.jsonl" || rc=1
    du -sb "$dir"
    $run --preset tinyllama-1.1b --sharding full --steps 3 --warmup 1 --log-every 1 --checkpoint "$dir" \
      --checkpoint-format $format --resume --metrics "$out/checkpoint-$format-resumed.jsonl" || rc=1
    rm -rf "$dir"
  done
  return $rc
}
step checkpoints checkpoints
# The examples on every GPU in each precision they support, a short run each.
run_examples() {
  local run="build/gpu/libddp/ddprun --nproc-per-node ${EXAMPLE_GPUS:-gpu} --standalone" p
  for p in fp32 tf32 bf16 fp16; do
    $run build/gpu/examples/resnet50/train_resnet50 --precision $p --steps ${EXAMPLE_STEPS:-20} --log-every 10 --eval-batches 2 \
      --metrics "$out/resnet50-$p.jsonl" || return 1
  done
  for p in fp32 tf32 bf16 fp16 fp8; do
    $run build/gpu/examples/llama/train_llama --preset tinyllama-1.1b --precision $p --steps ${EXAMPLE_STEPS:-20} --warmup 5 \
      --log-every 10 --eval-batches 1 --metrics "$out/llama-$p.jsonl" || return 1
  done
}
step examples run_examples
# libddp against PyTorch DDP, 1..N GPUs; SCALING_ARGS is split into words on purpose.
# shellcheck disable=SC2086
step scaling python3 benchmarks/scaling/run_scaling.py --build build/gpu --out "$out" --prefix scaling ${SCALING_ARGS:-}
# One step of each model under the profiler (rank 0 of PROFILE_GPUS, default 1),
# libddp and PyTorch, and the kernels that differ (PROFILE_CONFIGS: model:precision
# pairs; PROFILE_LIBDDP_ARGS: more scaling_bench flags, e.g. --unfused).
profile_steps() {
  local config model precision name gpus=${PROFILE_GPUS:-1} rc=0
  for config in ${PROFILE_CONFIGS:-llama:bf16 resnet50:bf16 llama:fp8}; do
    model=${config%%:*} precision=${config#*:} name=$out/profile-$model-$precision-${gpus}gpu
    # shellcheck disable=SC2086
    build/gpu/libddp/ddprun --nproc-per-node $gpus --standalone build/gpu/benchmarks/scaling/scaling_bench \
      --model $model --precision $precision --warmup 5 --steps 5 --json "$name-rows.jsonl" \
      --profile-trace "$name-libddp.json" ${PROFILE_LIBDDP_ARGS:-} || rc=1
    [[ $precision == fp8 ]] && continue  # no PyTorch fp8 here (torchao)
    python3 -m torch.distributed.run --standalone --nproc-per-node $gpus benchmarks/scaling/pytorch_ddp.py \
      --model $model --precision $precision --warmup 5 --steps 5 --json "$name-rows.jsonl" \
      --profile-trace "$name-pytorch.json" || rc=1
    python3 benchmarks/scaling/kernel_diff.py --labels libddp,pytorch --gaps 10 "$name-libddp.json" "$name-pytorch.json" \
      | tee "$name-diff.txt" || rc=1
  done
  return $rc
}
step profile profile_steps
echo "== gpu_check: $([[ $status == 0 ]] && echo all steps passed || echo some steps FAILED)"
exit $status
