"""An optimizer over parameter groups that a helper of the script builds from the model."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def param_groups(model, weight_decay):
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        (no_decay if p.ndim < 2 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(param_groups(model, 0.01), lr=0.05)
    for epoch in range(3):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    rank = int(os.environ.get("RANK", "0"))
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"weights": weights}, f)


if __name__ == "__main__":
    main()
