"""Worker for tests/runtime/test_nprocess_safety.py: the script's own process-group helper and
the Accelerator, in both orders. Run under torchrun with 2 processes.

``script_first``: the script's ``setup()`` initialises the group, then ``Accelerator()`` reuses
it; one DDP step and a gather run on it; ``end_training`` leaves it, and the script destroys it.
Writes OUT_DIR/rank{r}.json. ``accelerator_first``: ``Accelerator()`` initialises the group, then
``setup()`` calls ``dist.init_process_group`` again: the process fails (torch's error, with the
runtime's note).
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


def setup() -> None:
    """What scripts' own helpers do (init_distributed_mode(args), setup(rank, world))."""
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


mode, out_dir = sys.argv[1], Path(sys.argv[2])
if mode == "script_first":
    setup()
    group = dist.group.WORLD
    accelerator = Accelerator()
    rank = accelerator.process_index
    model = accelerator.prepare(nn.Linear(2, 1))
    torch.manual_seed(rank)
    accelerator.backward(model(torch.randn(4, 2)).sum())
    gathered = accelerator.gather(torch.tensor([rank]))
    accelerator.end_training()
    result = {
        "num_processes": accelerator.num_processes,
        "same_group": dist.group.WORLD is group,
        "initialised_after_end_training": dist.is_initialized(),
        "gathered": gathered.tolist(),
        "grads_by_rank": accelerator.gather(model.module.weight.grad.reshape(1, -1)).tolist(),
    }
    dist.destroy_process_group()  # the script's own cleanup() still works
    result["destroyed_by_script"] = not dist.is_initialized()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
elif mode == "accelerator_first":
    accelerator = Accelerator()
    setup()
    (out_dir / f"rank{accelerator.process_index}.json").write_text("{}")  # never reached
else:
    raise SystemExit(f"unknown mode {mode}")
