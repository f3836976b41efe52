"""A module-level fit of a polynomial task drawn with no seed, on batches a function draws from
torch's global generator, with the update written by hand over the model's parameters (no
optimizer) and a stop on the step's own loss. Records, per process, the task, a checksum of each
step's batch, the losses, the number of steps and the final weights (read through `net.weight`)."""

import json
import os
import sys

import torch
import torch.nn.functional as F

DEGREE = 3
coeffs = torch.randn(DEGREE, 1) * 2
offset = torch.randn(1)


def powers(x):
    x = x.unsqueeze(1)
    return torch.cat([x ** k for k in range(1, DEGREE + 1)], 1)


def get_batch(size=32):
    x = powers(torch.rand(size) * 2 - 1)
    return x, x @ coeffs + offset


net = torch.nn.Linear(DEGREE, 1)
sums, losses = [], []
for step in range(1, 3001):
    xs, ys = get_batch()
    net.zero_grad()
    objective = F.mse_loss(net(xs), ys)
    value = objective.item()
    objective.backward()
    for weight in net.parameters():
        weight.data.add_(-0.3 * weight.grad)
    sums.append(float(xs.sum()))
    losses.append(value)
    if value < 1e-5:
        break

rank = int(os.environ.get("RANK", "0"))
print(f"stopped after {step} steps, loss {value:.2e}")
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({
        "rank": rank,
        "task": coeffs.view(-1).tolist() + offset.tolist(),
        "batch_sums": sums,
        "losses": losses,
        "steps": step,
        "weight": net.weight.detach().view(-1).tolist() + net.bias.detach().tolist(),
    }, f)
