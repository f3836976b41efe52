"""A regression trained full-batch with Adam over every row of fixed tensors, inside a function:
each step runs the model over all the rows and takes a hand-written mean squared error. Records,
per process, the losses, the rows each step covered, the final weights and the error over all
the rows after training."""

import json
import os
import sys

import torch


def main():
    torch.manual_seed(0)
    features = torch.randn(50, 3)
    labels = features @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(50, 1)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses, rows = [], []
    for epoch in range(40):
        optimizer.zero_grad()
        pred = model(features)
        loss = ((pred - labels) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        rows.append(pred.shape[0])
    with torch.no_grad():
        error = (model(features) - labels).pow(2).mean().item()
    rank = int(os.environ.get("RANK", "0"))
    results = {
        "rank": rank,
        "selected": int(features.shape[0]),
        "rows": rows,
        "losses": losses,
        "weights": [float(w) for p in model.parameters() for w in p.detach().flatten()],
        "error": error,
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
