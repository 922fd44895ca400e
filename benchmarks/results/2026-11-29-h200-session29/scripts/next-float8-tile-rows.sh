#!/usr/bin/env bash
# For the call after next-float8-instructions.sh, on its warm machine (prepared in session 29, not run): on top of
# float8-tile-fewer-instructions.patch, float8-tile-rows-per-input.patch gives the multi-input FP8 tiles (SwiGLU and
# its gradient) 128 rows, four 16-byte loads of each input in flight per thread where they had four in all
# (ptxas, sm_90: 56-58 -> 80 registers, so 4 -> 3 blocks of 256 threads per SM; 64/96 KiB -> 98/147 KiB of loads
# in flight per SM). LLaMA-1.1B fp8 captured, fewer-instructions against both, alternating, two rounds; the FP8
# tests and kernel bandwidth of the second. About 6 minutes (more if /tmp/patched is not there).
set -u
: "${OUT:?}"
here=benchmarks/results/2026-11-29-h200-session29/scripts
for tree in /tmp/patched /tmp/rows; do
  if [[ ! -f $tree/build/gpu/benchmarks/scaling/scaling_bench ]]; then
    rm -rf $tree && mkdir -p $tree && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C $tree
    (cd $tree && patch -p1 -s < "$OLDPWD/$here/float8-tile-fewer-instructions.patch") || { echo "patch A"; exit 1; }
    if [[ $tree == /tmp/rows ]]; then
      (cd $tree && patch -p1 -s < "$OLDPWD/$here/float8-tile-rows-per-input.patch") || { echo "patch B"; exit 1; }
    fi
    (cd $tree && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
       > /tmp/configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1)
    echo "$tree build rc=$? at $SECONDS s"
  fi
done
(cd /tmp/rows && cmake --build build/gpu --target ddp_float8_gpu_tests > /tmp/build-tests.log 2>&1 && cd build/gpu && \
   timeout 150 ctest -R "Float8" --output-on-failure > "$OUT/tests-rows.log" 2>&1)
echo "tests rc=$? at $SECONDS s"; grep -E "tests passed|Failed|FAILED" "$OUT/tests-rows.log" | head
lb() {  # lb TREE NAME FLAGS...
  local tree=$1 name=$2; shift 2
  timeout 120 $tree/build/gpu/libddp/ddprun --nproc-per-node 1 --standalone $tree/build/gpu/benchmarks/scaling/scaling_bench \
    --json "$OUT/rows.jsonl" "$@" > /tmp/run.log 2>&1
  echo "$name rc=$? at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*')"
}
r="--model llama --steps 12 --warmup 4 --cuda-graph --precision fp8 --fp8-fast-accum"
for round in 1 2; do
  lb /tmp/patched fewer-instructions-$round $r
  lb /tmp/rows rows-per-input-$round $r
done
lb /tmp/rows rows-per-input-profiled $r --profile-trace /tmp/rows.json
python3 $here/float8_kernel_bandwidth.py /tmp/rows.json | tee "$OUT/float8-kernels-rows.txt"
