"""A small sequence regressor fitted full-batch with LBFGS over every row of fixed tensors (input
and target cut from one tensor of waves, its first rows held out for evaluation): the optimizer
steps with a closure that runs the model over all the rows, backpropagates and returns the loss.
Records, per process, every closure call's loss and row count, how many closure calls each step
took, the final weights and the held-out loss."""

import json
import os
import sys

import torch
import torch.nn as nn


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(1, 12)
        self.head = nn.Linear(12, 1)

    def forward(self, series):
        h = torch.zeros(series.size(0), 12, dtype=torch.double)
        c = torch.zeros(series.size(0), 12, dtype=torch.double)
        outputs = []
        for value in series.split(1, dim=1):
            h, c = self.cell(value, (h, c))
            outputs.append(self.head(h))
        return torch.cat(outputs, dim=1)


if __name__ == "__main__":
    torch.manual_seed(0)
    phase = torch.rand(44, 1) * 6.28
    waves = torch.sin(torch.linspace(0, 6, 16) + phase).double()
    train_in = waves[4:, :-1]
    train_out = waves[4:, 1:]
    held_in = waves[:4, :-1]
    held_out = waves[:4, 1:]
    model = Forecaster().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6)
    losses, rows, calls, returned = [], [], [], []
    for step in range(4):
        before = len(losses)

        def closure():
            optimizer.zero_grad()
            forecast = model(train_in)
            loss = criterion(forecast, train_out)
            losses.append(loss.item())
            rows.append(forecast.shape[0])
            loss.backward()
            return loss

        returned.append(float(optimizer.step(closure)))
        calls.append(len(losses) - before)
    with torch.no_grad():
        held = criterion(model(held_in), held_out).item()
    rank = int(os.environ.get("RANK", "0"))
    results = {
        "rank": rank,
        "selected": int(train_in.shape[0]),
        "rows": rows,
        "losses": losses,
        "returned": returned,
        "calls": calls,
        "weights": [float(w) for p in model.parameters() for w in p.detach().flatten()],
        "held": held,
    }
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
