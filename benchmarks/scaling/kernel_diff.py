"""Compares the GPU work of two profiled training steps, kernel by kernel:
scaling_bench --profile-trace (libddp) against pytorch_ddp.py --profile-trace
(PyTorch DDP), or any two Chrome traces of LibTorch's/PyTorch's profiler.

    python3 benchmarks/scaling/kernel_diff.py libddp.json pytorch.json --top 25

Prints, for each trace, the span from the first GPU activity to the last, the
time the GPU was busy in it (overlapping activities on different streams
counted once), the sum of activity durations, and the number of launches;
then the kernels (and copies, sets) whose total time differs most between the
two, so that a step that is slower in one of them shows which kernels make
the difference. Kernel names are shortened to --width characters.

--gaps N also lists, for each trace, the N longest stretches in which the GPU
ran nothing, with the activities before and after each: a host that waits for
the device (a synchronising copy, say) shows as a gap right after the wait.
"""

import argparse
import collections
import json
import sys

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def gpu_events(path):
    with open(path) as trace_file:
        trace = json.load(trace_file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATEGORIES]


def idle_gaps(events):
    """Stretches between the first and the last activity in which none runs:
    (start us, length us, the activity that ended last before, the one after)."""
    gaps, end, last = [], None, None
    for event in sorted(events, key=lambda e: e["ts"]):
        if end is not None and event["ts"] > end:
            gaps.append((end, event["ts"] - end, last["name"], event["name"]))
        if end is None or event["ts"] + event["dur"] > end:
            end, last = event["ts"] + event["dur"], event
    return gaps


def summary(events):
    if not events:
        return {"span_ms": 0.0, "busy_ms": 0.0, "sum_ms": 0.0, "launches": 0}
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    idle = sum(length for _, length, _, _ in idle_gaps(events))
    return {"span_ms": span / 1e3, "busy_ms": (span - idle) / 1e3,
            "sum_ms": sum(e["dur"] for e in events) / 1e3, "launches": len(events)}


def by_name(events):
    totals = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        totals[e["name"]][0] += e["dur"] / 1e3
        totals[e["name"]][1] += 1
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", help="first Chrome trace (e.g. libddp's)")
    parser.add_argument("b", help="second Chrome trace (e.g. PyTorch's)")
    parser.add_argument("--labels", default="a,b", help="names of the two traces in the output")
    parser.add_argument("--top", type=int, default=25, help="kernels to list")
    parser.add_argument("--width", type=int, default=90, help="characters of a kernel name to print")
    parser.add_argument("--gaps", type=int, default=0, help="longest idle stretches of each trace to list")
    args = parser.parse_args()
    labels = args.labels.split(",")
    if len(labels) != 2:
        parser.error("--labels takes two names separated by a comma")

    events = [gpu_events(args.a), gpu_events(args.b)]
    for label, path, evs in zip(labels, (args.a, args.b), events):
        if not evs:
            sys.exit(f"kernel_diff.py: {path} holds no GPU activity (was it recorded with CUDA activities on?)")
        s = summary(evs)
        print(f"{label}: span {s['span_ms']:.2f} ms, busy {s['busy_ms']:.2f} ms, "
              f"sum {s['sum_ms']:.2f} ms, {s['launches']} launches  ({path})")

    def shorten(name):
        return name if len(name) <= args.width else name[:args.width - 3] + "..."

    for label, evs in zip(labels, events) if args.gaps > 0 else ():
        first = min(e["ts"] for e in evs)
        gaps = sorted(idle_gaps(evs), key=lambda gap: -gap[1])
        print(f"\n{label}: {len(gaps)} idle stretches, {sum(g[1] for g in gaps) / 1e3:.2f} ms; the longest:")
        for start, length, before, after in gaps[:args.gaps]:
            print(f"  {length / 1e3:7.3f} ms at {(start - first) / 1e3:8.2f} ms, after {shorten(before)}\n"
                  f"  {'':>26}before {shorten(after)}")

    totals = [by_name(evs) for evs in events]
    names = set(totals[0]) | set(totals[1])
    rows = []
    for name in names:
        (ms_a, n_a), (ms_b, n_b) = totals[0].get(name, (0.0, 0)), totals[1].get(name, (0.0, 0))
        rows.append((ms_a - ms_b, ms_a, n_a, ms_b, n_b, name))
    rows.sort(key=lambda row: -abs(row[0]))
    print(f"\n{'diff ms':>9} {labels[0] + ' ms':>10} {'n':>5} {labels[1] + ' ms':>10} {'n':>5}  kernel")
    for diff, ms_a, n_a, ms_b, n_b, name in rows[:args.top]:
        print(f"{diff:9.3f} {ms_a:10.3f} {n_a:5d} {ms_b:10.3f} {n_b:5d}  {shorten(name)}")


if __name__ == "__main__":
    main()
