"""A training loss summed over each batch's samples (the batch mean is what trains) and averaged over
the whole dataset after each epoch (printed and recorded): each process sums its own share, so the
sum must be reduced across processes before the division by `len(loader.dataset)`."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def train(model, loader, optimizer, averages):
    model.train()
    running = 0.0
    for x, y in loader:
        out = model(x)
        loss = F.mse_loss(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += F.mse_loss(out.detach(), y, reduction="sum").item()
    print(f"average loss {running / len(loader.dataset):.6f}")
    averages.append(running / len(loader.dataset))


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    averages = []
    for _ in range(3):
        train(model, loader, optimizer, averages)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"averages": averages}, f)


if __name__ == "__main__":
    main()
