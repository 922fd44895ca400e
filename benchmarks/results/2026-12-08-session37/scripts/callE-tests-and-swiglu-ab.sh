#!/usr/bin/env bash
# One start, any GPU: session 36's callC (the captured-step FP8 scenario fixed in 5aa08cb, never run on a GPU yet),
# then session 35's call3 (swiglu-tile-rows.patch A/B: LLaMA-1.1B captured fp8, two rounds, a profiled replay each,
# each FP8 kernel's bandwidth against the copy), cut off before the call's 600 s.
set -u
: "${OUT:?}"
SECONDS=0
bash benchmarks/results/2026-12-07-session36/scripts/callC-captured-tests.sh "$1"
timeout $((585 - SECONDS)) bash benchmarks/results/2026-12-07-session35/scripts/call3-swiglu-tile-rows-ab.sh "$1"
echo "callE done at $SECONDS s"
