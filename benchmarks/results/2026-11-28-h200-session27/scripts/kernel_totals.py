"""Per-kernel totals of gzipped Chrome traces (arguments): span, busy time, and the 45 kernels with the most time."""
import json,gzip,sys,collections,re
def load(p):
    t=json.load(gzip.open(p))
    ev=t['traceEvents'] if isinstance(t,dict) else t
    return [e for e in ev if e.get('ph')=='X' and str(e.get('cat','')).lower() in ('kernel','gpu_memcpy','gpu_memset')]
for p in sys.argv[1:]:
    ev=load(p); ev.sort(key=lambda e:e['ts'])
    span=ev[-1]['ts']+ev[-1]['dur']-ev[0]['ts']
    busy=0;end=None
    for e in ev:
        s,f=e['ts'],e['ts']+e['dur']
        if end is None or s>=end: busy+=e['dur']; end=f
        elif f>end: busy+=f-end; end=f
    by=collections.Counter(); n=collections.Counter()
    for e in ev: by[e['name'][:120]]+=e['dur']; n[e['name'][:120]]+=1
    print(f"== {p}: span {span/1e3:.2f} ms busy {busy/1e3:.2f} ms kernels {len(ev)}")
    for k,v in by.most_common(45): print(f"{v/1e3:8.3f} {n[k]:5d}  {k}")
