import json, gzip, collections, sys
def load(p):
    ev = json.load(gzip.open(p))
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    k = [e for e in ev if e.get("cat") == "kernel"]
    tot = collections.Counter(); cnt = collections.Counter()
    for e in k:
        n = e["name"][:80]; tot[n] += e["dur"]; cnt[n] += 1
    return tot, cnt, ev
a, ca, _ = load(sys.argv[1]); b, cb, evb = load(sys.argv[2])
print("busy", sum(a.values())/1e3, sum(b.values())/1e3)
rows = sorted(set(a) | set(b), key=lambda n: -(b[n] - a[n]))
for n in rows[:25]:
    print(f"{a[n]/1e3:8.3f} {b[n]/1e3:8.3f} {(b[n]-a[n])/1e3:+8.3f} {ca[n]:4d} {cb[n]:4d} {n}")
