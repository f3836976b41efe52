"""Per-rank decisions: ReduceLROnPlateau on the epoch's training loss, and early stopping on it."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset


def train_epoch(model, loader, optimizer):
    model.train()
    total = 0.0
    for x, y in loader:
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / len(loader)


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    # Even batches (rank 0's share on 2 processes) are learnable, odd ones (rank 1's) are noise:
    # each rank's own loss curve takes other plateau and stop decisions.
    noisy = (torch.arange(64) // 8) % 2 == 1
    y = torch.where(noisy[:, None], 3 * torch.randn(64, 1), x.sum(1, keepdim=True))
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler = ReduceLROnPlateau(optimizer, patience=0, factor=0.5, threshold=0.05)
    best, bad, lrs, stopped = float("inf"), 0, [], None
    for epoch in range(30):
        train_loss = train_epoch(model, loader, optimizer)
        scheduler.step(train_loss)
        lrs.append(optimizer.param_groups[0]["lr"])
        if train_loss < best - 0.02:
            best, bad = train_loss, 0
        else:
            bad += 1
        if bad >= 2:
            stopped = epoch
            break
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"lrs": lrs, "stopped": stopped, "best": best}, f)


if __name__ == "__main__":
    main()
