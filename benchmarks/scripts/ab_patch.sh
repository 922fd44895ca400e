#!/usr/bin/env bash
# A/B of a patch on the GPU machine: this tree ("base") against a copy with PATCH applied ("patched"), in one lease.
# Builds scaling_bench and ddprun in both (the copy as it is, without .git or build/), runs the given test regex in
# the patched tree, then each --run's scaling_bench arguments in both trees, alternating, for --rounds rounds, and
# with --profile one profiled replay of the first --run in each, diffed by kernel. Results under $OUT: rows.jsonl
# (every row; the last line of each run is its own), tests.log, diff.txt, patched.json.gz.
#
#   OUT=/tmp/out bash benchmarks/scripts/ab_patch.sh PATCH [--reverse] [--rounds N] [--tests REGEX --test-targets "T..."]
#       [--profile] --run "ARGS" [--run "ARGS" ...]
#
# --reverse: PATCH is already in this tree; the copy has it reversed and is the base. A tree built before (a warm
# machine) is not built again. Prints one line per step with the seconds since the start.
set -u
usage() { echo "ab_patch.sh: $1 (see the comment at the top)" >&2; exit 2; }
[[ $# -ge 1 ]] || usage "PATCH is missing"
[[ -f $1 ]] || usage "no patch file $1"
patch_file=$(realpath "$1")
shift
reverse=0 rounds=2 tests="" test_targets="" profile=0 runs=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --reverse) reverse=1 ;;
    --rounds) rounds=${2:?--rounds needs a number}; shift ;;
    --tests) tests=${2:?--tests needs a regex}; shift ;;
    --test-targets) test_targets=${2:?--test-targets needs target names}; shift ;;
    --profile) profile=1 ;;
    --run) runs+=("${2:?--run needs scaling_bench arguments}"); shift ;;
    *) usage "unknown argument $1" ;;
  esac
  shift
done
[[ ${#runs[@]} -gt 0 ]] || usage "no --run"
[[ -z $tests || -n $test_targets ]] || usage "--tests needs --test-targets (the test executables to build)"
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
here=$PWD
copy=/tmp/ab-$(basename "$patch_file" .patch)
if [[ $reverse == 1 ]]; then base=$copy patched=$here; else base=$here patched=$copy; fi

if [[ ! -d $copy ]]; then
  mkdir -p "$copy" && tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$copy"
  direction=()
  [[ $reverse == 1 ]] && direction=(-R)
  if ! (cd "$copy" && patch -p1 -s "${direction[@]}" < "$patch_file"); then
    rm -rf "$copy"  # a later call would take an unpatched copy for the patched tree
    echo "the patch does not apply"
    exit 1
  fi
fi
for tree in "$base" "$patched"; do
  [[ -x $tree/build/gpu/benchmarks/scaling/scaling_bench ]] && continue
  (cd "$tree" && bash cmake/scripts/configure.sh python build/gpu -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0 \
     > /tmp/ab-configure.log 2>&1 && cmake --build build/gpu --target scaling_bench ddprun > /tmp/ab-build.log 2>&1)
  rc=$?; echo "build $tree rc=$rc at $SECONDS s"
  [[ $rc == 0 ]] || { grep -E "error" /tmp/ab-configure.log /tmp/ab-build.log | head -20; exit 1; }
done
if [[ -n $tests ]]; then
  # shellcheck disable=SC2086  # the target names are words
  (cd "$patched" && cmake --build build/gpu --target $test_targets > /tmp/ab-build-tests.log 2>&1 && cd build/gpu &&
     timeout 200 ctest -R "$tests" --output-on-failure > "$OUT/tests.log" 2>&1)
  echo "tests rc=$? at $SECONDS s: $(grep -E "tests passed" "$OUT/tests.log")"
  grep -E "^\s+[0-9]+ - .*\(Failed|\*\*\*" "$OUT/tests.log" | head
fi

bench() {  # bench TREE NAME ARGS...
  local tree=$1 name=$2; shift 2
  # shellcheck disable=SC2068  # the run's arguments are words
  timeout 180 "$tree/build/gpu/libddp/ddprun" --nproc-per-node 1 --standalone "$tree/build/gpu/benchmarks/scaling/scaling_bench" \
    --json "$OUT/rows.jsonl" $@ > /tmp/ab-run.log 2>&1
  local rc=$?
  echo "$name rc=$rc at $SECONDS s $(tail -1 "$OUT/rows.jsonl" | grep -o '"step_ms": [0-9.]*')"
  [[ $rc == 0 ]] || tail -5 /tmp/ab-run.log
}
for round in $(seq "$rounds"); do
  for i in "${!runs[@]}"; do
    bench "$base" "base run$i round$round" "${runs[$i]}"
    bench "$patched" "patched run$i round$round" "${runs[$i]}"
  done
done
if [[ $profile == 1 ]]; then
  bench "$base" "base run0 profiled" "${runs[0]} --profile-trace /tmp/ab-base.json"
  bench "$patched" "patched run0 profiled" "${runs[0]} --profile-trace /tmp/ab-patched.json"
  python3 benchmarks/scaling/kernel_diff.py --labels base,patched --top 20 --gaps 3 --width 110 /tmp/ab-base.json \
    /tmp/ab-patched.json > "$OUT/diff.txt" 2>&1
  head -2 "$OUT/diff.txt"
  gzip -c /tmp/ab-patched.json > "$OUT/patched.json.gz"
fi
