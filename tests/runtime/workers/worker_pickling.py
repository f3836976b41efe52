"""Worker for tests/runtime/test_worker_pickling.py: DataLoader workers started with spawn and
forkserver over a Dataset that holds the Accelerator and prepared objects.

``worker_pickling.py OUT_DIR`` (directly: 1 process; under torchrun: N) writes
OUT_DIR/rank{r}.json. For each start method, one epoch of a prepared loader with
``num_workers=2`` whose Dataset holds the Accelerator, the prepared model, optimizer and
scheduler and an already iterated prepared loader, whose ``collate_fn`` and ``worker_init_fn``
hold the Accelerator too; every sample reports what the worker's copy of the Accelerator said.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from runtime import AccelError, Accelerator

SIZE = 16
WORKER_SEEN: dict[str, int] = {}  # set by worker_init_fn, in each worker process


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class HoldsAccelerator(Dataset):
    """A Dataset that keeps the Accelerator (and prepared objects) as attributes."""

    def __init__(self, accelerator, model, optimizer, scheduler, loader) -> None:
        self.accelerator = accelerator
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loader = loader

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int):
        acc = self.accelerator
        try:
            acc.wait_for_everyone()
            refused = ""
        except AccelError as error:
            refused = type(error).__name__
        with torch.no_grad():
            out = self.model(torch.ones(1, 1)).shape[-1]  # the user's module runs here
        row = {
            "index": index,
            "process_index": acc.process_index,
            "num_processes": acc.num_processes,
            "is_main_process": acc.is_main_process,
            "is_local_main_process": acc.is_local_main_process,
            "local_process_index": acc.local_process_index,
            "device": str(acc.device),
            "mixed_precision": acc.mixed_precision,
            "refused": refused,
            "model": type(self.model).__name__,
            "model_out": out,
            "optimizer": type(self.optimizer).__name__,
            "scheduler": type(self.scheduler).__name__,
            "loader_len": len(self.loader),
            "init_fn_rank": WORKER_SEEN.get("rank", -1),
        }
        return torch.tensor([float(index)]), json.dumps(row)


def init_worker(accelerator, worker_id: int) -> None:
    WORKER_SEEN["rank"] = accelerator.process_index


class Collate:
    """A collate_fn object holding the Accelerator."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator

    def __call__(self, items):
        xs = torch.stack([x for x, _ in items])
        rows = [dict(json.loads(r), collate_rank=self.accelerator.process_index) for _, r in items]
        return xs, rows


def run(context: str, accelerator: Accelerator) -> dict:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    held = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    model, optimizer, scheduler, held = accelerator.prepare(model, optimizer, scheduler, held)
    for _ in held:  # iterated before the workers start: its progress is pickled too
        pass
    dataset = HoldsAccelerator(accelerator, model, optimizer, scheduler, held)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context=context,
        collate_fn=Collate(accelerator), worker_init_fn=functools.partial(init_worker, accelerator),
    )
    loader = accelerator.prepare(loader)
    rows, losses = [], []
    for x, batch_rows in loader:
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        rows.extend(batch_rows)
        losses.append(loss.item())
    weight = accelerator.unwrap_model(model).layer.weight.item()
    return {"rows": rows, "losses": losses, "weight": weight}


def main() -> None:
    out_dir = Path(sys.argv[1])
    accelerator = Accelerator(cpu=True)
    result = {
        "process_index": accelerator.process_index,
        "num_processes": accelerator.num_processes,
        "contexts": {ctx: run(ctx, accelerator) for ctx in ("spawn", "forkserver")},
    }
    (out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
