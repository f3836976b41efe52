"""An optimizer built by a package's factory (`create_optimizer(args, model)`), stepped in a
function of the script after backward."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from optfactory import create_optimizer


def train_one_epoch(model, loader, optimizer, losses):
    model.train()
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--opt", default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(72, 6)
    y = (x[:, 0] + x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=6)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 2))
    optimizer = create_optimizer(args, model)
    losses = []
    for epoch in range(3):
        train_one_epoch(model, loader, optimizer, losses)
    rank = int(os.environ.get("RANK", "0"))
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "weights": weights}, f)


if __name__ == "__main__":
    main()
