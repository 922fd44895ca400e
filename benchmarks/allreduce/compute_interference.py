"""How much a reduction running beside compute slows the compute, by transport.

One process drives two GPUs. On each, a chain of bf16 GEMMs (the shape of a
LLaMA-1.1B MLP matmul) runs on the default stream, timed with CUDA events,
alternately alone and while a side stream moves gradient-sized buffers between
the GPUs the whole time:

  nccl        ncclAllReduce of fp32 buckets (SM kernels, as DDP's reducer runs);
  nccl-bf16   the same buckets in bf16 (half the bytes);
  copy-engine the same bytes as a reduce-scatter + all-gather would move them,
              as device-to-peer copies, which the copy engines carry (no SMs),
              plus the local add of the received half (a short SM kernel).

The slowdown of the GEMM chain against its time alone (the mean of the chains
alone just before and after it) is what each transport costs a backward pass
it overlaps. Prints one JSON object per line, then the median slowdowns.

    python3 benchmarks/allreduce/compute_interference.py [--json FILE]
"""

import argparse
import json
import statistics
import time

import torch
import torch.cuda.nccl as nccl

BUCKET_BYTES = 25 << 20  # DDP's default bucket
GEMM = (8192, 2048, 5632)  # tokens x dim x FFN of a LLaMA-1.1B MLP matmul


def timed_gemm_chain(device, a, b, steps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        start.record()
        for _ in range(steps):
            torch.mm(a, b)
        end.record()
    return start, end


def side_traffic(kind, buckets, scratch, streams, until_events):
    """Queues transfers on the side streams until each GPU's GEMM chain has
    ended; returns the rounds launched."""
    rounds = 0
    while not all(event.query() for event in until_events):
        # Both devices' current streams are the side streams: a copy between
        # GPUs orders itself after both, never after the GEMMs.
        with torch.cuda.stream(streams[0]), torch.cuda.stream(streams[1]):
            for i in range(len(buckets[0])):
                if kind.startswith("nccl"):
                    nccl.all_reduce([buckets[0][i], buckets[1][i]], streams=streams)
                    continue
                half = buckets[0][i].numel() // 2
                owned = (slice(0, half), slice(half, None))  # the half each GPU reduces
                for me in (0, 1):  # reduce-scatter: the peer's half goes to the peer
                    scratch[1 - me][i].copy_(buckets[me][i][owned[1 - me]], non_blocking=True)
                for me in (0, 1):
                    buckets[me][i][owned[me]].add_(scratch[me][i])
                for me in (0, 1):  # all-gather: the reduced half goes back
                    buckets[1 - me][i][owned[me]].copy_(buckets[me][i][owned[me]], non_blocking=True)
        rounds += 1
        # Keep the queue short, so the traffic stops soon after the GEMMs.
        for stream in streams:
            stream.synchronize()
    return rounds


def measure(kind, devices, operands, streams, traffic, gemms):
    """One timed GEMM chain per GPU, with `kind` of traffic beside it."""
    m, k, n = GEMM
    buckets, scratch = traffic.get(kind, (None, None))
    wall = time.perf_counter()
    events = [timed_gemm_chain(d, a, b, gemms) for d, (a, b) in zip(devices, operands)]
    rounds = side_traffic(kind, buckets, scratch, streams, [end for _, end in events]) if buckets else 0
    for d in devices:
        torch.cuda.synchronize(d)
    wall = time.perf_counter() - wall
    ms = [start.elapsed_time(end) for start, end in events]
    reduced = rounds * len(buckets[0]) * buckets[0][0].numel() if buckets else 0
    return {"traffic": kind, "gemm_ms": [round(x, 3) for x in ms],
            "gemm_tflops": round(2 * m * k * n * gemms / (max(ms) / 1e3) / 1e12, 1),
            "gradient_gelements_per_s": round(reduced / wall / 1e9, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gemms", type=int, default=200, help="GEMMs per timed chain")
    parser.add_argument("--buckets", type=int, default=8, help="buckets per round of traffic")
    parser.add_argument("--rounds", type=int, default=5, help="measurements of each kind of traffic")
    parser.add_argument("--json", help="append the rows to this file")
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("compute_interference needs two GPUs")
    devices = [torch.device("cuda", i) for i in range(2)]
    m, k, n = GEMM
    operands = [(torch.randn(m, k, device=d, dtype=torch.bfloat16), torch.randn(k, n, device=d, dtype=torch.bfloat16))
                for d in devices]
    streams = [torch.cuda.Stream(device=d) for d in devices]
    numel = BUCKET_BYTES // 4
    traffic = {}
    for kind in ("nccl", "nccl-bf16", "copy-engine"):
        dtype = torch.bfloat16 if kind == "nccl-bf16" else torch.float32
        traffic[kind] = ([[torch.ones(numel, device=d, dtype=dtype) for _ in range(args.buckets)] for d in devices],
                         [[torch.empty(numel - numel // 2, device=d, dtype=dtype) for _ in range(args.buckets)]
                          for d in devices])
    for kind in ("none", *traffic):  # warm-up: cuBLAS heuristics, NCCL's connections, clocks
        measure(kind, devices, operands, streams, traffic, args.gemms)
    # The GPUs' clocks drift under sustained GEMMs (18% between the first and
    # last chain of one run on 2 x H100): each traffic chain is measured
    # between two chains alone and compared with their mean.
    rows, slowdowns = [], {kind: [] for kind in traffic}
    before = measure("none", devices, operands, streams, traffic, args.gemms)
    rows.append(before)
    for _ in range(args.rounds):
        for kind in traffic:
            row = measure(kind, devices, operands, streams, traffic, args.gemms)
            after = measure("none", devices, operands, streams, traffic, args.gemms)
            alone = [(x + y) / 2 for x, y in zip(before["gemm_ms"], after["gemm_ms"])]
            row["slowdown"] = [round(t / a, 4) for t, a in zip(row["gemm_ms"], alone)]
            slowdowns[kind] += row["slowdown"]
            rows += [row, after]
            before = after
            print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name(0)
    summary = {"device": device, "gemm": GEMM, "bucket_bytes": BUCKET_BYTES,
               "median_slowdown": {kind: round(statistics.median(v), 4) for kind, v in slowdowns.items()},
               "spread": {kind: [min(v), max(v)] for kind, v in slowdowns.items()}}
    if args.json:
        with open(args.json, "a") as out:
            for row in rows:
                out.write(json.dumps(row | {"device": device}) + "\n")
            out.write(json.dumps(summary) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
