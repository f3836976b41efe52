"""No spawn: the process group is joined only when `--world-size` is above 1, and the same flag
chooses the DDP wrapper and a DistributedSampler. Each process writes what it trained on to
`<out>/rank<R>.json`."""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--url", default="tcp://127.0.0.1:29517")
    cfg = parser.parse_args()
    cfg.multi = cfg.world_size > 1
    if cfg.multi:
        dist.init_process_group("gloo", init_method=cfg.url, world_size=cfg.world_size, rank=cfg.rank)
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    if cfg.multi:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.randn(24, 3, generator=g), torch.randn(24, 1, generator=g), torch.arange(24))
    if cfg.multi:
        sampler = DistributedSampler(data)
    else:
        sampler = None
    loader = DataLoader(data, batch_size=6, shuffle=sampler is None, sampler=sampler)
    seen = []
    for epoch in range(2):
        if cfg.multi:
            sampler.set_epoch(epoch)
        seen.append([])
        for x, y, index in loader:
            loss = torch.nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen[-1] += index.tolist()
    weights = [w for p in net.parameters() for w in p.detach().flatten().tolist()]
    with open(os.path.join(cfg.out, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
        json.dump({"seen": seen, "weights": weights}, f)


if __name__ == "__main__":
    main()
