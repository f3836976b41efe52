"""Worker for tests/runtime/test_exit.py: train with DDP + accumulation on 2 gloo processes, end
the job the way ARGV[1] says, and return straight away (no I/O that would release the GIL).

    end_training: accelerator.end_training()   torch: dist.barrier() + dist.destroy_process_group()
    nothing: leave it to the runtime's exit handler
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator


def main() -> None:
    how = sys.argv[1]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # Over 1 MB of gradients: DDP's first bucket is capped at 1 MB, so each step all-reduces two
    # buckets at once, one per gloo worker thread (the hang did not show with one small bucket).
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    data = TensorDataset(torch.randn(2 * 80 * 32, 256), torch.randint(0, 10, (2 * 80 * 32,)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=32, shuffle=True))
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    if how == "end_training":
        accelerator.end_training()
    elif how == "torch":
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    elif how != "nothing":
        raise SystemExit(f"unknown ending {how!r}")


main()
