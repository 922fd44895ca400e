#!/usr/bin/env bash
# A/B of a patch on the GPU machine: this tree ("base") against a copy with PATCH applied ("patched"), in one lease.
# Builds scaling_bench and ddprun in both (incrementally where an earlier call left a build), runs the given test
# regex in the patched tree, then each --run's scaling_bench arguments in both trees, alternating, for --rounds
# rounds, and with --profile one profiled replay of the first --run in each, diffed by kernel. Results under $OUT:
# rows.tgz (one rows-TREE-runI-roundR.jsonl per run, and rows-TREE-profiled.jsonl: archived in one file, since the
# device returns only a few files a call), tests.log, diff.txt, patched.json.gz; the profiled replays' traces stay
# in /tmp/ab-base.json and /tmp/ab-patched.json.
#
#   OUT=/tmp/out bash benchmarks/scripts/ab_patch.sh PATCH [--reverse | --base-patch BASE_PATCH] [--rounds N]
#       [--tests REGEX --test-targets "T..."] [--profile] --run "ARGS" [--run "ARGS" ...]
#
# --reverse: PATCH is already in this tree; the copy has it reversed and is the base. --base-patch: both sides get
# BASE_PATCH first (the base is then a copy too: the one an earlier call made for BASE_PATCH alone, build and all).
# A copy is made afresh from this tree on every call (its build folder kept), in a folder named by its patches'
# contents and direction. Set DDP_GIT_COMMIT to name the tree in the rows. Prints one line per step with the seconds since the start.
set -u -o pipefail
usage() { echo "ab_patch.sh: $1 (see the comment at the top)" >&2; exit 2; }
[[ $# -ge 1 ]] || usage "PATCH is missing"
[[ -f $1 ]] || usage "no patch file $1"
patch_file=$(realpath "$1")
shift
reverse=0 base_patch="" rounds=2 tests="" test_targets="" profile=0 runs=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --reverse) reverse=1 ;;
    --base-patch) [[ -f ${2:-} ]] || usage "no base patch file ${2:-}"; base_patch=$(realpath "$2"); shift ;;
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
[[ $reverse == 0 || -z $base_patch ]] || usage "--reverse and --base-patch do not go together"
: "${OUT:?set OUT to the results folder}"
mkdir -p "$OUT"
here=$PWD
direction=-N  # forward; -R reverses
[[ $reverse == 1 ]] && direction=-R

# make_copy PATCH...: prints the copy's folder, named by the last patch and all of their contents, after filling it
# with this tree's files as they are now and each patch in order; a build left there by an earlier call is kept
# (and brought up to date below).
make_copy() {
  local copy p
  copy=/tmp/ab-$(basename "${!#}" .patch)-$(cat "$@" | sha256sum | cut -c1-12)$direction
  mkdir -p "$copy"
  find "$copy" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
  tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$copy" || { echo "copying the tree failed" >&2; return 1; }
  for p in "$@"; do
    (cd "$copy" && patch -p1 -s "$direction" < "$p" >&2) || { echo "$p does not apply" >&2; return 1; }
  done
  echo "$copy"
}
if [[ $reverse == 1 ]]; then
  base=$(make_copy "$patch_file") patched=$here || exit 1
elif [[ -n $base_patch ]]; then
  base=$(make_copy "$base_patch") && patched=$(make_copy "$base_patch" "$patch_file") || exit 1
else
  base=$here patched=$(make_copy "$patch_file") || exit 1
fi

for tree in "$base" "$patched"; do
  log=/tmp/ab-build-$(basename "$tree").log
  (cd "$tree" && { [[ -f build/gpu/build.ninja ]] || bash cmake/scripts/configure.sh python build/gpu \
     -DDDP_WARNINGS_AS_ERRORS=ON -DTORCH_CUDA_ARCH_LIST=9.0; } > "$log" 2>&1 &&
     cmake --build build/gpu --target scaling_bench ddprun >> "$log" 2>&1)
  rc=$?; echo "build $tree rc=$rc at $SECONDS s"
  [[ $rc == 0 ]] || { grep -E "error|Error" "$log" | head -20; exit 1; }
done
if [[ -n $tests ]]; then
  # shellcheck disable=SC2086  # the target names are words
  if (cd "$patched" && cmake --build build/gpu --target $test_targets > /tmp/ab-build-tests.log 2>&1); then
    (cd "$patched/build/gpu" && timeout 200 ctest -R "$tests" --output-on-failure > "$OUT/tests.log" 2>&1)
    echo "tests rc=$? at $SECONDS s: $(grep -E "tests passed" "$OUT/tests.log")"
    sed -n '/The following tests FAILED/,$p' "$OUT/tests.log" | head
  else
    echo "test build failed at $SECONDS s:"; grep -E "error" /tmp/ab-build-tests.log | head -20
  fi
fi

bench() {  # bench TREE ROWS_FILE NAME ARGS: the run's row alone in ROWS_FILE
  local tree=$1 rows=$2 name=$3; shift 3
  rm -f "$rows"
  # shellcheck disable=SC2068  # the run's arguments are words
  timeout 180 "$tree/build/gpu/libddp/ddprun" --nproc-per-node 1 --standalone "$tree/build/gpu/benchmarks/scaling/scaling_bench" \
    --json "$rows" $@ > /tmp/ab-run.log 2>&1
  local rc=$?
  if [[ $rc == 0 && -s $rows ]]; then
    echo "$name rc=0 at $SECONDS s $(grep -o '"step_ms": [0-9.]*' "$rows")"
  else
    echo "$name rc=$rc at $SECONDS s, no row:"; tail -5 /tmp/ab-run.log
    return 1
  fi
}
for round in $(seq "$rounds"); do
  for i in "${!runs[@]}"; do
    bench "$base" "$OUT/rows-base-run$i-round$round.jsonl" "base run$i round$round" "${runs[$i]}"
    bench "$patched" "$OUT/rows-patched-run$i-round$round.jsonl" "patched run$i round$round" "${runs[$i]}"
  done
done
if [[ $profile == 1 ]]; then
  rm -f /tmp/ab-base.json /tmp/ab-patched.json
  bench "$base" "$OUT/rows-base-profiled.jsonl" "base run0 profiled" "${runs[0]} --profile-trace /tmp/ab-base.json" &&
    bench "$patched" "$OUT/rows-patched-profiled.jsonl" "patched run0 profiled" \
      "${runs[0]} --profile-trace /tmp/ab-patched.json" || exit 1
  python3 benchmarks/scaling/kernel_diff.py --labels base,patched --top 20 --gaps 3 --width 110 /tmp/ab-base.json \
    /tmp/ab-patched.json > "$OUT/diff.txt" 2>&1
  head -2 "$OUT/diff.txt"
  gzip -c /tmp/ab-patched.json > "$OUT/patched.json.gz"
fi
(cd "$OUT" && tar czf rows.tgz rows-*.jsonl && rm rows-*.jsonl)
