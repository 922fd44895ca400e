#!/usr/bin/env bash
# For the next session, one start (the device budget went to failed starts twice running): callC (the FP8
# captured-step scenario fixed in 5aa08cb, never run on a GPU), then callB (issue 29's side-by-side rows and, on an
# H200, the LLaMA-2-7B preset), in one call.
set -u
: "${OUT:?}"
SECONDS=0
here=benchmarks/results/2026-12-07-session36/scripts
bash $here/callC-captured-tests.sh "$1"
timeout $((590 - SECONDS)) bash $here/callB-side-by-side-and-7b.sh "$1"
echo "callD done at $SECONDS s"
