#!/usr/bin/env bash
# Session 8, call 1 (two GPUs): build; ddp::Join over NCCL incl. the sharded modes; train_llama --uneven join
# with --sharding full and gradients on both GPUs (tiny model, seq 256, so that an epoch ends within the run).
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
CTEST_ARGS="-R DdpNccl.Join" timeout 300 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|Join.*(Passed|Failed)|rank [01] exit|differs" $OUT/ctest_gpu.log | head -12 | cut -c1-300
b=build/gpu
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$stdlib" -maxdepth 1 -name '*.py' -print0 | LC_ALL=C sort -z | head -z -n 20 | xargs -0 cat > $OUT/text.txt
tokens=$($b/examples/make_tokens --input $OUT/text.txt --output $OUT/text.bin | sed -E 's/.*wrote ([0-9]+) tokens.*/\1/')
batch=$(python3 -c "
w=($tokens-1)//256
print(next(b for b in range(16,4,-1) if w-(w//(2*b))*2*b>=b))")
echo "tokens $tokens, batch $batch, steps per epoch $(( (tokens-1)/256/(2*batch) )) + a tail"
for mode in full gradients; do
  timeout 150 $b/libddp/ddprun --nproc-per-node 2 --standalone $b/examples/llama/train_llama --preset tiny --vocab 256 \
    --seq-len 256 --batch $batch --precision bf16 --steps 100 --log-every 20 --eval-batches 2 --data $OUT/text.bin \
    --uneven join --sharding $mode --clip-grad-norm 1.0 --grad-accum 2 > $OUT/uneven-$mode.log 2>&1
  echo "train_llama --uneven join --sharding $mode rc=$?"
  grep -E "rank0\]: (step|LLaMA|uniform|memory)|uneven tail|error" $OUT/uneven-$mode.log | head -14 | cut -c1-250
done
rm -f $OUT/text.txt $OUT/text.bin
