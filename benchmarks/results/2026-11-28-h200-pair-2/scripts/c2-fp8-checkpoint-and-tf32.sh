#!/usr/bin/env bash
# Session 23 call 2 (one H200): the FP8 delayed-scaling checkpoint fix on the GPU: the new tests, then the same
# tests against a mutant that drops the state again (load_module ignores it, the sharded format never writes it),
# which must fail; then ResNet-50 tf32 side by side on one GPU (libddp captured, torch.compile, and its CUDA graphs).
set -u
: "${OUT:?}"
nvidia-smi -L
bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 > /tmp/configure.log 2>&1
targets="ddp_sharding_gpu_tests ddp_example_gpu_tests train_llama train_resnet50 ddprun scaling_bench"
cmake --build build/gpu --target $targets > /tmp/build.log 2>&1; echo "build rc=$? at $SECONDS s"
grep -E "error" /tmp/build.log | head -5
tests="Float8DelayedScalingSurvivesEveryCheckpointFormat|AKilledFp8LlamaRunResumesExactly|OptimizerStateCheckpointResumesInAnotherMode"
ctest --test-dir build/gpu -R "$tests" --output-on-failure > "$OUT/tests.log" 2>&1; echo "tests rc=$? at $SECONDS s"
grep -E "Passed|Failed|\*\*\*" "$OUT/tests.log" | head -8
# The mutant: the state is dropped again on both paths.
cp libddp/checkpoint/module_state.cpp /tmp/module_state.cpp; cp libddp/checkpoint/sharded_checkpoint.cpp /tmp/sharded_checkpoint.cpp
sed -i 's/    Float8LinearAccess::load_scaling(\*float8_layer, path, scaling);/    (void)scaling;/' libddp/checkpoint/module_state.cpp
sed -i 's/          archive.write(kFloat8Scaling, float8_layers);/          (void)float8_layers;/' libddp/checkpoint/sharded_checkpoint.cpp
git diff --stat -- libddp/checkpoint | tail -1
cmake --build build/gpu --target $targets > /tmp/build.log 2>&1; echo "mutant build rc=$? at $SECONDS s"
ctest --test-dir build/gpu -R "Float8DelayedScalingSurvivesEveryCheckpointFormat|AKilledFp8LlamaRunResumesExactly" \
  --output-on-failure > "$OUT/mutant-tests.log" 2>&1; echo "mutant tests rc=$? (must fail) at $SECONDS s"
grep -E "Passed|Failed|differs|Which is|step [0-9]" "$OUT/mutant-tests.log" | head -12
cp /tmp/module_state.cpp libddp/checkpoint/module_state.cpp; cp /tmp/sharded_checkpoint.cpp libddp/checkpoint/sharded_checkpoint.cpp
cmake --build build/gpu --target scaling_bench ddprun > /tmp/build.log 2>&1; echo "rebuild rc=$? at $SECONDS s"
timeout $((590 - SECONDS)) python3 benchmarks/scaling/run_scaling.py --build build/gpu --gpus 1 --steps 20 --warmup 5 \
  --out "$OUT" --prefix resnet-tf32 --models resnet50 --precisions tf32 \
  --impls libddp-graph,pytorch-compile,pytorch-compile-graphs > "$OUT/resnet-tf32.log" 2>&1
echo "tf32 rc=$? at $SECONDS s"
python3 - "$OUT" <<'PY'
import glob, json, sys
rows = []
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    rows += json.load(open(path))["rows"]
for path in sorted(glob.glob(sys.argv[1] + "/*.rows.jsonl")):
    rows += [json.loads(line) for line in open(path) if line.strip()]
for r in rows:
    print(r.get("impl"), r.get("model"), r.get("precision"), r.get("gpus"), round(r.get("throughput") or 0),
          r.get("step_ms"), str(r.get("error", ""))[:100])
PY
