"""Worker for tests/runtime/test_prepared_loader_samplers.py: the user's samplers, sharded.

Run under torchrun with 2 processes: ``user_samplers.py OUT_DIR``; writes OUT_DIR/rank{r}.json.
Each rank seeds its global RNGs differently (as per-rank seeding scripts do); rank 0 starts each
loader from the RNG state a 1-process run of the unprepared loader starts from, which every rank
computes as the reference order.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from torch.utils.data import (
    BatchSampler, DataLoader, Sampler, SubsetRandomSampler, TensorDataset, WeightedRandomSampler,
)

from runtime import Accelerator

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
rank = accelerator.process_index
dataset = TensorDataset(torch.arange(50))


class Evens(Sampler[int]):
    """A custom deterministic sampler: the even indices, in order."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(range(0, self.size, 2))

    def __len__(self) -> int:
        return (self.size + 1) // 2


class ShuffledPairs(Sampler[list[int]]):
    """A custom batch sampler drawing its order from python's random module."""

    def __iter__(self):
        pairs = [[i, i + 1] for i in range(0, 48, 2)]
        random.shuffle(pairs)
        return iter(pairs)

    def __len__(self) -> int:
        return 24


def build(name: str) -> DataLoader:
    if name == "subset":
        return DataLoader(dataset, batch_size=4, sampler=SubsetRandomSampler(list(range(40))))
    if name == "weighted":
        weights = [0.0 if i % 5 == 0 else 1.0 for i in range(50)]
        return DataLoader(dataset, batch_size=4, sampler=WeightedRandomSampler(weights, 32))
    if name == "custom":
        return DataLoader(dataset, batch_size=4, sampler=Evens(48))
    if name == "sequential":
        return DataLoader(dataset, batch_size=5, shuffle=False)
    if name == "batch_sampler":
        return DataLoader(dataset, batch_sampler=ShuffledPairs())
    raise ValueError(name)


def seed(value: int) -> None:
    torch.manual_seed(value)
    random.seed(value)


def batches_of(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


result: dict = {"rank": rank}
for name in ("subset", "weighted", "custom", "sequential", "batch_sampler"):
    reference: list[list[list[int]]] = []
    seed(0)
    plain = build(name)
    for _ in range(2):
        reference.append(batches_of(plain))
    user = build(name)
    loader = accelerator.prepare(user)
    seed(0 if rank == 0 else 1000 + rank)
    epochs = [batches_of(loader) for _ in range(2)]
    result[name] = {
        "epochs": epochs,
        "reference": reference,
        "len_loader": len(loader),
        "len_sampler": len(loader.sampler),
        "sampler_len_matches_iteration": len(loader.sampler) == sum(len(b) for b in epochs[0]),
        "dataset_is_users": loader.dataset is user.dataset,
        "batch_size": loader.batch_size,
    }
    if name == "subset":
        result[name]["indices_read_through"] = list(loader.sampler.indices) == list(range(40))

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
