"""PyTorch's own DistributedDataParallel over Gloo on 2 CPU processes: the
reference that libddp's test_ddp_vs_pytorch compares against.

Weights and data come from closed-form formulas (no random generator), so the
C++ side builds exactly the same ones. Rank 0 writes the parameters after
training, as float32 in named_parameters() order, to the file given.

usage: python3 torch_ddp_reference.py OUT_FILE
"""
import math
import os
import socket
import struct
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

WORLD, STEPS = 2, 3


def formula(shape, offset, scale):
    n = math.prod(shape)
    return (torch.sin(torch.arange(n, dtype=torch.float64) * 0.37 + offset) * scale).float().reshape(shape)


def make_model():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.copy_(formula(p.shape, k, 0.3))
    return model


def batch(step, rank):
    x = formula((4, 16), 1.3 * step + 0.7 * rank, 1.0)
    y = formula((4, 4), 2.1 * step + 0.5 * rank, 1.0)
    return x, y


def run(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    if rank == 0:
        values = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).tolist()
        with open(out, "wb") as f:
            f.write(struct.pack(f"<{len(values)}f", *values))
    # Leave without PyTorch's Gloo teardown: in about one run in six on 2.x it
    # aborts a process ("terminate called without an active exception") after
    # the results are written. The barrier keeps rank 0 serving the store until
    # every rank is done with it.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, sys.argv[1]), nprocs=WORLD, join=True)
