"""Hand gradient accumulation over a module constant bound right below the device choice."""

import json
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
accum = 4
lr = 0.05

torch.manual_seed(0)
x = torch.randn(64, 6)
y = x @ torch.arange(1.0, 7.0).unsqueeze(1) + 0.1 * torch.randn(64, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=2, shuffle=True)
model = nn.Linear(6, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
steps = 0

for epoch in range(2):
    for i, (xb, yb) in enumerate(loader):
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        loss = loss / accum
        loss.backward()
        if (i + 1) % accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1

rank = int(os.environ.get("RANK", "0"))
weights = [p.detach().flatten().tolist() for p in model.parameters()]
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"weights": weights, "steps": steps}, f)
