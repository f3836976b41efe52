"""DDP training launched by `mp.spawn` on CPU (gloo, 2 processes), the shape AM007 converts.

Each rank writes `rank<i>.json` into the directory given as the first argument: its rank and world
size, its per-step losses, the ids of the samples it trained on, and the final weights.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(rank, world_size, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[0.1], [-0.2], [0.05], [0.3]]) + 0.01
    data = TensorDataset(x, y, torch.arange(64))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, seen = [], []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb, ids in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seen.extend(ids.tolist())
    weights = [w for p in model.parameters() for w in p.detach().flatten().tolist()]
    record = {"rank": rank, "world_size": world_size, "losses": losses, "seen": seen, "weights": weights}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    world_size = 2
    mp.spawn(worker, args=(world_size, sys.argv[1]), nprocs=world_size)
