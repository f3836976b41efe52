"""A regression trained on batches drawn from torch's global generator, which the script never
seeds (no DataLoader). Records, per process, the seed torch started from, a checksum of each step's
batch, and the final weights."""

import json
import os
import sys

import torch
from torch import nn


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.tensor([[1.0], [-2.0], [0.5], [3.0]], device=device)
    sums, losses = [], []
    for step in range(40):  # enough steps that the loss falls far below a quarter whatever the draws
        batch = torch.randn(16, 4).to(device)
        loss = nn.functional.mse_loss(model(batch), batch @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        sums.append(float(batch.sum()))
        losses.append(loss.item())
    rank = int(os.environ.get("RANK", "0"))
    results = {
        "rank": rank,
        "initial_seed": torch.initial_seed(),
        "batch_sums": sums,
        "losses": losses,
        "weight": [float(w) for w in model.weight.detach().flatten().cpu()],
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
