"""A torchrun script whose own helper joins the process group and returns the device (gloo, CPU).

`device = setup()` is both the setup and the device choice. Each rank writes `rank<i>.json` into
the directory given as the first argument: rank, world size, per-step losses, the ids of the
samples it trained on and the final weights.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup():
    dist.init_process_group(backend="gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def main(out_dir):
    device = setup()
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    y = x @ torch.tensor([[0.1], [-0.2], [0.05], [0.3]]) + 0.01
    data = TensorDataset(x, y, torch.arange(64))
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, seen = [], []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb, ids in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seen.extend(ids.tolist())
    weights = [w for p in model.parameters() for w in p.detach().flatten().tolist()]
    rank, world_size = dist.get_rank(), dist.get_world_size()
    record = {"rank": rank, "world_size": world_size, "losses": losses, "seen": seen, "weights": weights}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
