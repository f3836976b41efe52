"""A model whose `forward` splits its batch over the GPUs with the functional `data_parallel` when
it is given several (`--gpus N`, on CUDA inputs), else calls its layers directly: on a CPU the
original takes the direct path. Each process writes `rank<i>.json` into the directory given as the
first argument: rank, world size, per-step losses and the final weights."""

import argparse
import json
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(nn.Module):
    def __init__(self, gpus):
        super().__init__()
        self.gpus = gpus
        self.layers = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        if x.is_cuda and self.gpus > 1:
            out = nn.parallel.data_parallel(self.layers, x, range(self.gpus))
        else:
            out = self.layers(x)
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = Regressor(args.gpus).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(3):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    weights = [w for p in model.parameters() for w in p.detach().flatten().tolist()]
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    record = {"rank": rank, "world_size": world_size, "losses": losses, "weights": weights}
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    main()
