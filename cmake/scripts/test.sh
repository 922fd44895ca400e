#!/usr/bin/env bash
# Builds and tests libddp in the two configurations CI covers:
#   (a) Debian's LibTorch 1.13 (CPU) with Gloo: every CPU test, multi-process runs included;
#   (b) LibTorch 2.x with CUDA from PyPI, against the CUDA toolkit and NCCL: the whole
#       tree (NCCL backend, GPU tests, benchmarks) must compile and link; the tests that
#       need neither a GPU nor Gloo run, the GPU tests report themselves skipped.
# Extra arguments go to ctest (e.g. -L gpu).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
bash cmake/scripts/setup_debian.sh --cuda
jobs=$(nproc)

echo "== (a) Debian LibTorch 1.13, CPU, Gloo"
bash cmake/scripts/configure.sh system build/cpu -DDDP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build/cpu -j "$jobs"
ctest --test-dir build/cpu --output-on-failure -j "$jobs" "$@"

echo "== (b) LibTorch 2.x with CUDA, NCCL"
bash cmake/scripts/configure.sh python build/cuda -DDDP_WARNINGS_AS_ERRORS=ON >/dev/null
cmake --build build/cuda -j "$jobs"
ctest --test-dir build/cuda --output-on-failure -j "$jobs" "$@"
