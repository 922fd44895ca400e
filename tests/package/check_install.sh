#!/usr/bin/env bash
# What an outside project does with libddp: install a build tree into a fresh
# prefix, build tests/package/consumer against it with nothing but
# CMAKE_PREFIX_PATH=prefix (the package must find its LibTorch by itself), and
# run it as a 2-rank job under the installed ddprun.
#   check_install.sh BUILD_DIR run|build-only
# build-only: the library has no CPU backend (Gloo), so the job cannot run here.
set -euo pipefail
build_dir=$(cd "${1:?usage: check_install.sh BUILD_DIR run|build-only}" && pwd)
mode=${2:?usage: check_install.sh BUILD_DIR run|build-only}
[[ $mode == run || $mode == build-only ]] || { echo "check_install: mode must be run or build-only, not '$mode'" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() { echo "check_install: FAILED: $*" >&2; exit 1; }

echo "== install $build_dir into $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; }
for file in bin/ddprun include/ddp/ddp.h; do
  [[ -e $prefix/$file ]] || fail "the install has no $file"
done
config=$(find "$prefix" -name ddpConfig.cmake -print -quit)
[[ -n $config ]] || fail "the install has no ddpConfig.cmake"
for file in ddpConfigVersion.cmake ddpTargets.cmake; do
  [[ -e $(dirname "$config")/$file ]] || fail "the install has no $file beside $config"
done

echo "== configure and build the consumer against $prefix"
generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$build_dir/CMakeCache.txt")
args=(-S "$here/consumer" -B "$work/consumer" -G "$generator" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix")
# Torch's CMake files declare very old minimum versions, which CMake 4 refuses.
cmake_major=$(cmake --version | head -1 | sed -E 's/[^0-9]*([0-9]+).*/\1/')
((cmake_major >= 4)) && args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
cmake "${args[@]}" || fail "configuring the consumer (find_package(ddp) against $prefix)"
cmake --build "$work/consumer" || fail "building the consumer"

if [[ $mode == build-only ]]; then
  echo "check_install: consumer built and linked; the 2-rank run is SKIPPED: this libddp has no Gloo backend," \
    "so a job needs GPUs (NCCL), and the test runs without them"
  exit 0
fi
echo "== $prefix/bin/ddprun --nproc-per-node 2 --standalone consumer_app"
"$prefix/bin/ddprun" --nproc-per-node 2 --standalone "$work/consumer/consumer_app" || fail "the 2-rank job under the installed ddprun"
echo "check_install: passed"
