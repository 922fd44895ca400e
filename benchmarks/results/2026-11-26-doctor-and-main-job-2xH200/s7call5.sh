#!/usr/bin/env bash
# Session 7, call 5 (two GPUs): build; ddp::Join over NCCL (with the optimizer handover); train_llama --uneven join
# on both GPUs on the Python standard library's text (tiny model, seq 256, so that an epoch ends within the run).
set -u
cd "$(dirname "$0")/.."
export DDP_GIT_COMMIT=${DDP_GIT_COMMIT:-wip}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CTEST_ARGS="-R DdpNccl.Join" timeout 300 bash cmake/scripts/gpu_check.sh $OUT ctest_gpu > $OUT/gpu_check.log 2>&1
echo "rc=$? after $SECONDS s"
grep -c "warning:" $OUT/build.log; grep -E "warning:|error:" $OUT/build.log | head -5 | cut -c1-300
grep -E "tests passed|Join.*(Passed|Failed)|rank [01] exit" $OUT/ctest_gpu.log | head -10 | cut -c1-300
b=build/gpu
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$stdlib" -maxdepth 1 -name '*.py' -print0 | LC_ALL=C sort -z | head -z -n 20 | xargs -0 cat > $OUT/text.txt
tokens=$($b/examples/make_tokens --input $OUT/text.txt --output $OUT/text.bin | sed -E 's/.*wrote ([0-9]+) tokens.*/\1/')
# A batch size whose epoch leaves a step for rank 0 alone (windows of 256 tokens, 2 ranks).
batch=$(python3 -c "
w=($tokens-1)//256
print(next(b for b in range(16,4,-1) if w-(w//(2*b))*2*b>=b))")
echo "tokens $tokens, batch $batch, steps per epoch $(( (tokens-1)/256/(2*batch) )) + a tail"
timeout 200 $b/libddp/ddprun --nproc-per-node 2 --standalone $b/examples/llama/train_llama --preset tiny --vocab 256 \
  --seq-len 256 --batch $batch --precision bf16 --steps 120 --log-every 20 --eval-batches 2 --data $OUT/text.bin \
  --uneven join > $OUT/uneven.log 2>&1
echo "train_llama --uneven join rc=$?"
grep -E "rank0\]: (step|LLaMA|uniform)|uneven tail|error" $OUT/uneven.log | head -20 | cut -c1-250
rm -f $OUT/text.txt $OUT/text.bin
