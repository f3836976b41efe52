"""Worker for test_data_extra.py's equivalence test: train with split_batches=True.

Run once with plain ``python`` (1 process) and once under torchrun (2 processes); both write
OUT/world{N}.json (rank 0) with the global batches seen and the final weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator

out_dir = Path(sys.argv[1])
accelerator = Accelerator(split_batches=True)
result: dict = {}
for name, make_opt, steps in (
    ("sgd", lambda p: torch.optim.SGD(p, lr=0.1), 10),
    ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-2), 200),
):
    torch.manual_seed(0)  # same weights, data and shuffle seed on every process count
    x = torch.randn(96, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(96, 1)
    loader = DataLoader(TensorDataset(x, y, torch.arange(96)), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = make_opt(model.parameters())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    seen, step = [], 0
    while step < steps:
        for xb, yb, idx in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            seen.append(accelerator.gather(idx).tolist())
            step += 1
            if step == steps:
                break
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    result[name] = {"seen": seen, "weights": weights.tolist()}
if accelerator.is_main_process:
    (out_dir / f"world{accelerator.num_processes}.json").write_text(json.dumps(result))
accelerator.end_training()
