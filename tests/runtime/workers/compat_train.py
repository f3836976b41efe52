"""Worker for test_accelerate_compat.py: one small training script, two Accelerators.

``python compat_train.py runtime|accelerate OUT`` (1 process) or the same under torchrun
(2 processes). The only difference between the two backends is the import below. Each rank writes
OUT/rank{R}.json with, for every variant (``generator``: the loaders get an explicit
torch.Generator; ``global_rng``: they do not), per training step the sample indices the rank
received, the loss (float.hex, so comparisons are exact), sync_gradients and the learning rate;
then the gathered evaluation indices/predictions and the final weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

backend, out_dir = sys.argv[1], Path(sys.argv[2])
if backend == "accelerate":
    from accelerate import Accelerator
else:
    from runtime import Accelerator

TRAIN_SIZE, EVAL_SIZE, BATCH, ACCUMULATION, EPOCHS = 70, 37, 8, 2, 2


def train(accelerator, with_generator: bool) -> dict:
    torch.manual_seed(0)
    x = torch.randn(TRAIN_SIZE, 8)
    y = (x @ torch.randn(8, 1)).squeeze(1) + 0.1 * torch.randn(TRAIN_SIZE)
    ex = torch.randn(EVAL_SIZE, 8)
    train_set = TensorDataset(x, y, torch.arange(TRAIN_SIZE))
    eval_set = TensorDataset(ex, torch.arange(EVAL_SIZE))
    generator = torch.Generator().manual_seed(1234) if with_generator else None
    train_loader = DataLoader(train_set, batch_size=BATCH, shuffle=True, generator=generator)
    eval_loader = DataLoader(eval_set, batch_size=BATCH)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + 0.1 * step))
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler
    )
    steps: list[dict] = []
    for _ in range(EPOCHS):
        model.train()
        for xb, yb, idx in train_loader:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(xb).squeeze(1), yb)
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            steps.append(
                {
                    "idx": idx.tolist(),
                    "loss": float(loss).hex(),
                    "sync": bool(accelerator.sync_gradients),
                    "lr": float(scheduler.get_last_lr()[0]).hex(),
                }
            )
    model.eval()
    eval_idx: list[int] = []
    eval_pred: list[str] = []
    eval_local = 0
    with torch.no_grad():
        for xb, idx in eval_loader:
            eval_local += len(idx)
            pred, gathered_idx = accelerator.gather_for_metrics((model(xb).squeeze(1), idx))
            eval_idx += gathered_idx.tolist()
            eval_pred += [float(p).hex() for p in pred]
    weights = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    return {
        "steps": steps,
        "eval_idx": eval_idx,
        "eval_pred": eval_pred,
        "eval_local": eval_local,
        "weights": [float(w).hex() for w in weights],
    }


accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
result = {
    "backend": backend,
    "num_processes": accelerator.num_processes,
    "generator": train(accelerator, with_generator=True),
    "global_rng": train(accelerator, with_generator=False),
}
rank = accelerator.process_index
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.wait_for_everyone()
accelerator.end_training()
if os.environ.get("WORLD_SIZE", "1") != "1" and backend == "accelerate":
    # Accelerate's end_training does not destroy the gloo group; do it so the exit is clean.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
