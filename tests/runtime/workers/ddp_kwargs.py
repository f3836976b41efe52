"""Worker for tests/runtime/test_ddp_kwargs_handler.py: every option `DistributedDataParallelKwargs`
takes (the ones the migration carries from a removed DDP wrap) reaches the DistributedDataParallel
that `prepare` builds at 2 processes.

``ddp_kwargs.py OUT_DIR`` under torchrun writes OUT_DIR/rank{r}.json: the wrapped model's options as
DDP holds them, its BatchNorm running mean before and after prepare (`broadcast_buffers=False`
also skips the buffers' broadcast when DDP is built), and the weights after two steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from runtime import Accelerator, DistributedDataParallelKwargs

out_dir = Path(sys.argv[1])

accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(
    dim=1, broadcast_buffers=False, bucket_cap_mb=7, find_unused_parameters=True,
    gradient_as_bucket_view=True, static_graph=True,
)])
rank = accelerator.process_index
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 1))
model[1].running_mean.fill_(float(rank + 1))  # this process's own statistics
before = model[1].running_mean.tolist()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
assert isinstance(model, DistributedDataParallel), type(model)
after = accelerator.unwrap_model(model)[1].running_mean.tolist()
torch.manual_seed(10 + rank)
for _ in range(2):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    optimizer.zero_grad()
    accelerator.backward(nn.functional.mse_loss(model(x), y))
    optimizer.step()
(out_dir / f"rank{rank}.json").write_text(json.dumps({
    "dim": model.dim,
    "broadcast_buffers": model.broadcast_buffers,
    "bucket_bytes_cap": model.bucket_bytes_cap,
    "find_unused_parameters": model.find_unused_parameters,
    "gradient_as_bucket_view": model.gradient_as_bucket_view,
    "static_graph": model.static_graph,
    "before": before,
    "after": after,
    "weight": accelerator.unwrap_model(model)[2].weight.flatten().tolist(),
}))
accelerator.end_training()
