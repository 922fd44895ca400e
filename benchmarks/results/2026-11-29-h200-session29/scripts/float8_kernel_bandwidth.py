"""The FP8 tile kernels' mean times in a Chrome trace of one LLaMA-1.1B step (argument) and their bandwidth, against
the device copy bandwidth measured now. Bytes per element at LLaMA-1.1B's shapes (4 x 2048 tokens, hidden 5632):
SwiGLU forward reads gate and up (bf16) and writes the FP8 data and transpose, 6 bytes; its gradient reads grad_y,
gate and up and writes two FP8 casts with transposes, 10 bytes. The plain casts have several shapes: total only."""
import collections
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../../scripts"))
from device_copy_bandwidth import device_copy_tbps  # noqa: E402

ELEMENTS = 4 * 2048 * 5632
BYTES_PER_ELEMENT = {"SwigluToFloat8": 6, "SwigluGradientsToFloat8": 10}
times = collections.defaultdict(list)
for e in json.load(open(sys.argv[1]))["traceEvents"]:
    if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel" or "float8_tile_kernel" not in e["name"]:
        continue
    functor = next((f for f in BYTES_PER_ELEMENT if f"::{f}," in e["name"]), None)
    key = functor or ("Identity cast of fp32" if "float8_tile_kernel<float," in e["name"] else "Identity cast of bf16")
    times[key].append(e["dur"] / 1e3)

copy_tbps = device_copy_tbps()
print(f"device copy of 256 MiB: {copy_tbps:.2f} TB/s (read + write)")
for key, values in sorted(times.items()):
    mean = sum(values) / len(values)
    line = f"{key}: {len(values)} kernels, {sum(values):.3f} ms in all, {mean:.4f} ms each"
    if key in BYTES_PER_ELEMENT:
        tbps = ELEMENTS * BYTES_PER_ELEMENT[key] / mean / 1e9
        line += f", {tbps:.2f} TB/s = {tbps / copy_tbps:.2f} of the copy"
    print(line)
