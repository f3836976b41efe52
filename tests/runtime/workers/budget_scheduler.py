"""Worker for tests/runtime/test_scheduler_budget_loop.py: a poly LambdaLR in a
``while step < total_steps`` loop, prepared, on 2 processes.

``budget_scheduler.py OUT_DIR``: writes OUT_DIR/rank{r}.json with the learning rates of the
default Accelerator (Accelerate's rule: N advances per step) and of
``step_scheduler_with_optimizer=False``, next to the unprepared scheduler's (the one-process
rates), and the warnings raised.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator

out_dir = Path(sys.argv[1])
TOTAL = 12


def poly(step: int) -> float:
    return (1 - step / TOTAL) ** 0.9


def run(accelerator: Accelerator | None) -> list[float]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, poly)
    loader = DataLoader(TensorDataset(torch.randn(16, 3)), batch_size=4)
    if accelerator is not None:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    rates, step = [], 0
    while step < TOTAL:  # an iteration budget: as many optimizer steps on any number of processes
        for (x,) in loader:
            optimizer.zero_grad()
            loss = model(x).pow(2).mean()
            if accelerator is None:
                loss.backward()
            else:
                accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            rates.append(scheduler.get_last_lr()[0])
            step += 1
            if step >= TOTAL:
                break
    return rates


reference = run(None)  # what one process does (the unprepared scheduler)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    accelerator = Accelerator()
    default_rates = run(accelerator)
per_call = run(Accelerator(step_scheduler_with_optimizer=False))
result = {
    "rank": accelerator.process_index,
    "reference": [float(r) for r in reference],
    "default": [r if isinstance(r, float) else str(r) for r in default_rates],
    "per_call": [float(r) for r in per_call],
    "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning],
}
(out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))
accelerator.end_training()
