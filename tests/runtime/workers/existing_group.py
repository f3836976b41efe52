"""Worker for tests/runtime/test_existing_group.py: the script builds the default process group
itself from a batch scheduler's variables (SLURM_PROCID, SLURM_NTASKS; no RANK / WORLD_SIZE in the
environment, as under `srun python train.py`), then creates the Accelerator and prepares a model.

Started as 2 plain processes (not torchrun). Usage: existing_group.py MODE URL OUT_DIR.
``join``: one step on each rank's own data; writes OUT_DIR/rank{r}.json with what the Accelerator
says and the weights after the step. ``mismatch``: the environment also says WORLD_SIZE=4 (the
group has 2): creating the Accelerator must fail.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from runtime import Accelerator


def init_distributed_mode(url: str) -> int:
    """What training scripts' own helpers do on SLURM: rank and size from the scheduler."""
    rank = int(os.environ["SLURM_PROCID"])
    dist.init_process_group("gloo", init_method=url, world_size=int(os.environ["SLURM_NTASKS"]), rank=rank)
    return rank


mode, url, out_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
assert "RANK" not in os.environ and "LOCAL_RANK" not in os.environ
rank = init_distributed_mode(url)
accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
model = nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
prepared, optimizer = accelerator.prepare(model, optimizer)
torch.manual_seed(100 + rank)  # each rank its own batch
loss = prepared(torch.randn(4, 3)).pow(2).mean()
accelerator.backward(loss)
optimizer.step()
result = {
    "num_processes": accelerator.num_processes,
    "process_index": accelerator.process_index,
    "local_process_index": accelerator.local_process_index,
    "wrapped": prepared is not model,
    "weights": [p.detach().reshape(-1).tolist() for p in model.parameters()],
}
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
