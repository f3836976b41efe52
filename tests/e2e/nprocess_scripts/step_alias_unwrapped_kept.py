"""`model_without_ddp = model` builds the optimizer and is saved; the step calls `model` itself."""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1, keepdim=True) + 0.1 * torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = torch.nn.Linear(3, 1)
    model_without_ddp = model
    optimizer = torch.optim.SGD(model_without_ddp.parameters(), lr=0.05)
    for epoch in range(3):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    rank = int(os.environ.get("RANK", "0"))
    weights = [p.detach().flatten().tolist() for p in model_without_ddp.parameters()]
    keys = sorted(model_without_ddp.state_dict())
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"weights": weights, "keys": keys}, f)


if __name__ == "__main__":
    main()
