"""Checks the include rules of docs/architecture.md: which folders of libddp/
may include which, and that the public headers include only public headers.
Exits 1 naming every include that breaks a rule."""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# folder -> the other libddp folders its files may include (docs/architecture.md).
ALLOWED = {
    "compat": set(),
    "cuda": set(),
    "launcher": set(),
    "optim": {"compat", "cuda"},
    "precision": {"compat", "float8/support.h", "cuda/stream_capture.h"},
    "float8": {"compat", "cuda", "rmsnorm/autograd.h", "rmsnorm/backward_kernel.cuh", "optim/weight_casts.h"},
    "comm": {"compat", "cuda"},
    "runtime": {"comm", "compat"},
    "doctor": set(),
    "batchnorm": {"cuda"},
    "rmsnorm": {"cuda"},
    "capture": {"comm"},
    "sharding": {"reducer/bucket_assignment.h", "reducer/row_major.h"},
    "checkpoint": {"sharding/sharded_parameters.h", "optim/fused_step.h", "reducer/row_major.h",
                   "float8/linear_state.h"},
    "reducer": {"compat", "sharding/sharded_parameters.h", "sharding/unit_schedule.h", "cuda/stream_capture.h"},
}
# The one file that composes reducer, sharding and checkpoint.
COMPOSER = "reducer/data_parallel_core.cpp"
INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def main():
    broken = []
    libddp = os.path.join(ROOT, "libddp")
    for folder in sorted(os.listdir(libddp)):
        path = os.path.join(libddp, folder)
        if not os.path.isdir(path):
            continue
        if folder not in ALLOWED:
            broken.append(f"libddp/{folder}/: a folder docs/architecture.md does not list")
            continue
        for name in sorted(os.listdir(path)):
            source = f"{folder}/{name}"
            with open(os.path.join(path, name), errors="replace") as f:
                for bracket, included in INCLUDE.findall(f.read()):
                    if bracket != '"' or "/" not in included:
                        continue
                    other = included.split("/")[0]
                    if other == folder or source == COMPOSER or other in ALLOWED[folder] or included in ALLOWED[folder]:
                        continue
                    broken.append(f"libddp/{source} includes \"{included}\"")
    public = os.path.join(ROOT, "include", "ddp")
    for name in sorted(os.listdir(public)):
        with open(os.path.join(public, name)) as f:
            for bracket, included in INCLUDE.findall(f.read()):
                if bracket == '"':
                    broken.append(f"include/ddp/{name} includes \"{included}\" (public headers include <ddp/...> only)")
    for line in broken:
        print("include rule broken:", line)
    print(f"{len(broken)} include(s) break the rules of docs/architecture.md" if broken else "include rules hold")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
