# kernel time per name of two chrome traces (per profiled step), the largest differences both ways
import json, gzip, collections, sys
def load(p):
    ev = json.load(gzip.open(p) if p.endswith(".gz") else open(p))
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    tot = collections.Counter(); cnt = collections.Counter()
    for e in ev:
        if e.get("cat") == "kernel" or e.get("cat") == "gpu_memcpy":
            n = e["name"][:90]; tot[n] += e.get("dur", 0); cnt[n] += 1
    return tot, cnt
a, ca = load(sys.argv[1]); b, cb = load(sys.argv[2])
print(sys.argv[1], "->", sys.argv[2]); print("busy ms", sum(a.values()) / 1e3, sum(b.values()) / 1e3)
rows = sorted(set(a) | set(b), key=lambda n: -abs(b[n] - a[n]))
for n in rows[:30]:
    print(f"{a[n]/1e3:9.3f} {b[n]/1e3:9.3f} {(b[n]-a[n])/1e3:+8.3f} {ca[n]:5d} {cb[n]:5d} {n}")
