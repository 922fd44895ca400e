"""Where the compute stream of a profiled step waits: its idle stretches
(longer than --min-us) with their position in the step and what the other
streams ran meanwhile. Reads a Chrome trace of scaling_bench --profile-trace.

    python3 stream_gaps.py trace.json --top 25
"""
import argparse
import collections
import json

GPU = {"kernel", "gpu_memcpy", "gpu_memset"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--min-us", type=float, default=20.0)
    args = parser.parse_args()
    trace = json.load(open(args.trace))
    events = [e for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
              if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU]
    stream = lambda e: e.get("args", {}).get("stream", e.get("tid"))
    busy = collections.Counter()
    for e in events:
        busy[stream(e)] += e["dur"]
    first = min(e["ts"] for e in events)
    last = max(e["ts"] + e["dur"] for e in events)
    print(f"span {(last - first) / 1e3:.2f} ms; per stream busy ms:",
          ", ".join(f"{s}: {t / 1e3:.2f}" for s, t in busy.most_common()))
    compute = busy.most_common(1)[0][0]
    mine = sorted((e for e in events if stream(e) == compute), key=lambda e: e["ts"])
    others = [e for e in events if stream(e) != compute]
    gaps = []
    end, before = mine[0]["ts"], mine[0]
    for e in mine:
        if e["ts"] - end > args.min_us:
            gaps.append((end, e["ts"] - end, before["name"], e["name"]))
        if e["ts"] + e["dur"] > end:
            end, before = e["ts"] + e["dur"], e
    total = sum(g[1] for g in gaps)
    print(f"compute stream {compute}: {len(gaps)} gaps over {args.min_us} us, {total / 1e3:.2f} ms; "
          f"from its first to last kernel {(end - mine[0]['ts']) / 1e3:.2f} ms")
    for start, length, prev, nxt in sorted(gaps, key=lambda g: -g[1])[:args.top]:
        during = collections.Counter()
        for o in others:
            overlap = min(o["ts"] + o["dur"], start + length) - max(o["ts"], start)
            if overlap > 0:
                during[o["name"][:50]] += overlap
        meanwhile = "; ".join(f"{n} {t:.0f}us" for n, t in during.most_common(3)) or "nothing"
        print(f"{length:8.0f} us at {(start - first) / 1e3:7.2f} ms  after {prev[:60]}\n"
              f"{'':>20} before {nxt[:60]}\n{'':>20} meanwhile: {meanwhile}")


if __name__ == "__main__":
    main()
