"""One optimizer chosen among if/elif alternatives (one of them a class of a module outside the run),
over parameter groups a helper of that module builds from the model (DINO's shape)."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import grouptools


def train(args):
    torch.manual_seed(0)
    x = torch.randn(64, 5)
    y = x @ torch.linspace(-1, 1, 5).unsqueeze(1) + 0.1 * torch.randn(64, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    groups = grouptools.decay_groups(model, 0.01)
    if args.opt == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=args.lr)
    elif args.opt == "sgd":
        optimizer = torch.optim.SGD(groups, lr=args.lr)
    elif args.opt == "lars":
        optimizer = grouptools.Lars(groups, lr=args.lr)
    losses = []
    for epoch in range(3):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    rank = int(os.environ.get("RANK", "0"))
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "weights": weights}, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--opt", default="lars")
    parser.add_argument("--lr", type=float, default=0.02)
    train(parser.parse_args())
