#!/usr/bin/env bash
# Configures a build tree.
#   configure.sh system BUILD_DIR [CMAKE_ARGS...]   Debian's LibTorch 1.13 (CPU, Gloo)
#   configure.sh python BUILD_DIR [CMAKE_ARGS...]   the torch package of python3 (2.x with CUDA, NCCL)
# CMAKE_ARGS go to cmake last, e.g. -DDDP_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/opt/libddp.
set -euo pipefail
flavour=$1
build_dir=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
args=(-S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release)
if [[ "$flavour" == python ]]; then
  args+=(-DDDP_TORCH_FROM_PYTHON=ON)
  # NCCL of the torch wheel, so the library and LibTorch load the same one.
  nccl_root=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  [[ -n "$nccl_root" && -e "$nccl_root/include/nccl.h" ]] && args+=(-DNCCL_ROOT="$nccl_root")
fi
# Torch's own CMake files still declare very old minimum versions, which CMake 4 refuses.
cmake_major=$(cmake --version | head -1 | sed -E 's/[^0-9]*([0-9]+).*/\1/')
((cmake_major >= 4)) && args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
cmake "${args[@]}" "$@"
