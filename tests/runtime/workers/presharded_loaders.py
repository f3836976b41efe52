"""Worker for tests/runtime/test_nprocess_safety.py: loaders that already shard by rank.

Run under torchrun with 2 processes; writes OUT_DIR/rank{r}.json. Each case builds a DataLoader
whose sampler is a DistributedSampler (as a script's own helper does), prepares it, and records
what this rank iterated in two epochs, what torch's DistributedSampler alone gives this rank, and
what gather_for_metrics returns over an epoch.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from runtime import Accelerator
from runtime.errors import PrepareError

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
rank, n = accelerator.process_index, accelerator.num_processes

CASES = {
    "divisible": dict(size=16, batch_size=4, shuffle=True, drop_last=False),
    "padded": dict(size=11, batch_size=4, shuffle=True, drop_last=False),
    "sequential_padded": dict(size=9, batch_size=2, shuffle=False, drop_last=False),
    "sampler_drop_last": dict(size=11, batch_size=4, shuffle=True, drop_last=True),
    "per_sample": dict(size=7, batch_size=None, shuffle=True, drop_last=False),
    "batch_sampler": dict(size=11, batch_size=3, shuffle=True, drop_last=False, via_batch_sampler=True),
}


def build(cfg: dict) -> tuple[DataLoader, DistributedSampler]:
    dataset = TensorDataset(torch.arange(cfg["size"]))
    sampler = DistributedSampler(dataset, shuffle=cfg["shuffle"], drop_last=cfg["drop_last"], seed=7)
    if cfg.get("via_batch_sampler"):
        loader = DataLoader(dataset, batch_sampler=BatchSampler(sampler, cfg["batch_size"], False))
    else:
        loader = DataLoader(dataset, batch_size=cfg["batch_size"], sampler=sampler)
    return loader, sampler


def ids(batch) -> list[int]:
    return torch.atleast_1d(batch[0]).tolist()


result: dict = {"rank": rank, "cases": {}}
for name, cfg in CASES.items():
    loader, sampler = build(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepared = accelerator.prepare(loader)
    epochs, expected = [], []
    for epoch in range(2):
        epochs.append([i for batch in prepared for i in ids(batch)])
        reference = DistributedSampler(
            loader.dataset, shuffle=cfg["shuffle"], drop_last=cfg["drop_last"], seed=7
        )
        reference.set_epoch(epoch)
        expected.append(list(reference))
    gathered = []
    for batch in prepared:
        gathered += accelerator.gather_for_metrics(batch[0].reshape(-1)).tolist()
    result["cases"][name] = {
        "epochs": epochs,
        "expected": expected,
        "gathered": gathered,
        "num_samples": sampler.num_samples,
        "warnings": [str(w.message) for w in caught],
    }

# The script sets the epoch itself (e.g. resuming at epoch 5): its value wins.
loader, sampler = build(CASES["padded"])
prepared = accelerator.prepare(loader)
prepared.sampler.set_epoch(5)
got = [i for batch in prepared for i in ids(batch)]
reference = DistributedSampler(loader.dataset, shuffle=True, seed=7)
reference.set_epoch(5)
result["script_epoch"] = {"got": got, "expected": list(reference), "sampler_kept": prepared.sampler is sampler}

# A sampler built for another job size or rank is refused with both numbers.
errors = {}
dataset = TensorDataset(torch.arange(12))
for label, kwargs in {
    "replicas": dict(num_replicas=3, rank=rank),
    "rank": dict(num_replicas=n, rank=(rank + 1) % n),
}.items():
    try:
        accelerator.prepare(DataLoader(dataset, batch_size=2, sampler=DistributedSampler(dataset, **kwargs)))
        errors[label] = None
    except PrepareError as error:
        errors[label] = str(error)
result["errors"] = errors

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
