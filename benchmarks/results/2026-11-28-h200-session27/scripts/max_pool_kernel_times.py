"""The max-pooling kernels' times in a Chrome trace (argument), and the device copy bandwidth measured now."""
import json
import sys

import torch

for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e.get("ph") == "X" and "max_pool" in e.get("name", "") and str(e.get("cat", "")).lower() == "kernel":
        print(f"{e['dur'] / 1e3:.3f} ms  {e['name'][:110]}")
x = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    y.copy_(x)
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end) / 20
print(f"device copy of 256 MiB: {ms:.3f} ms, {2 * x.numel() / ms / 1e9:.2f} TB/s (read + write)")
