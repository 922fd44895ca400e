#!/usr/bin/env bash
# Teardown times of a 2-rank Gloo train_llama --preset tiny job under faults (this machine, 2 cores).
B=${BUILD:-build/cpu}
run() { $B/libddp/ddprun --nproc-per-node 2 --standalone "$@"; }
pid_of_rank() { # rank -> pid of the train_llama worker with RANK=$1
  for p in $(pgrep -f "examples/llama/train_llama"); do
    tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "RANK=$1" && { echo $p; return; }
  done
}
now() { date +%s.%N; }
case1() { # kill -STOP rank 0 with --timeout 5
  run --timeout 5 $B/examples/llama/train_llama --steps 100000 --log-every 1000 > c1.log 2>&1 & local d=$!
  sleep 8; local p; p=$(pid_of_rank 0); kill -STOP $p; local t0; t0=$(now); wait $d; local rc=$?; local t1; t1=$(now)
  echo "stopped rank 0 (--timeout 5): ddprun exit $rc after $(echo "$t1 - $t0" | bc) s; named: $(grep -c 'rank 0 is stopped, hung or has exited' c1.log)"
}
case2() { # kill -9 rank 1
  run $B/examples/llama/train_llama --steps 100000 --log-every 1000 > c2.log 2>&1 & local d=$!
  sleep 8; local p; p=$(pid_of_rank 1); kill -9 $p; local t0; t0=$(now); wait $d; local rc=$?; local t1; t1=$(now)
  echo "SIGKILL of rank 1: ddprun exit $rc after $(echo "$t1 - $t0" | bc) s"
}
case3() { # SIGKILL of ddprun, workers behind a wrapper script without exec
  $B/libddp/ddprun --nproc-per-node 2 --standalone /bin/sh -c "$B/examples/llama/train_llama --steps 100000 --log-every 1000; true" > c3.log 2>&1 & local d=$!
  sleep 8; local before; before=$(pgrep -fc "examples/llama/train_llama --steps"); kill -9 $d; local t0; t0=$(now)
  while pgrep -f "examples/llama/train_llama --steps" > /dev/null; do sleep 0.01; done; local t1; t1=$(now)
  echo "SIGKILL of ddprun (wrapper without exec, $before workers): all gone after $(echo "$t1 - $t0" | bc) s"
}
case1; case2; case3
