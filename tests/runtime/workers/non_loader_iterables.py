"""Worker for tests/runtime/test_prepare_non_loader.py: what prepare() does with batch sources that
are not torch DataLoaders, and with a DataLoader subclass.

Run under torchrun (1 or 2 processes); writes OUT_DIR/rank{r}.json: the samples this rank drew
from a prepared DataLoader subclass over two epochs, and, for each non-DataLoader iterable, either
"unchanged" (prepare returned the very object), the batches this rank drew from what prepare
returned, or the PrepareError's message; and this rank's share of a batch source of its own
(7 batches) over two epochs.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from runtime import Accelerator
from runtime.errors import PrepareError

out_dir = Path(sys.argv[1])
accelerator = Accelerator()


class CountingLoader(DataLoader):
    """A DataLoader subclass, as libraries define them."""


class BatchList:
    """A batch source of the script's own, iterable but no DataLoader (a torchtext-style iterator),
    with an epoch counter and a length."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = batches
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches)

    def init_epoch(self) -> None:
        self.epoch += 1

    def __iter__(self):
        return iter(self.batches)


class OwnGeneratorShuffle:
    """Shuffles its batches with a torch.Generator of its own, seeded differently on each process."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = batches
        self.generator = torch.Generator().manual_seed(1000 + accelerator.process_index)

    def __iter__(self):
        order = torch.randperm(len(self.batches), generator=self.generator).tolist()
        return iter([self.batches[i] for i in order])


class Shuffler:
    """torchtext's RandomShuffler: python `random`'s state, taken when it is built, used for each shuffle."""

    def __init__(self) -> None:
        self._random_state = random.getstate()

    def __call__(self, data: list) -> list:
        old = random.getstate()
        random.setstate(self._random_state)
        data = random.sample(data, len(data))
        self._random_state = random.getstate()
        random.setstate(old)
        return data


class KeptStateShuffle:
    """A torchtext-style iterator: its shuffler keeps the (here per-process) state of python `random`."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        random.seed(2000 + accelerator.process_index)
        self.batches = batches
        self.random_shuffler = Shuffler()

    def __iter__(self):
        return iter(self.random_shuffler(self.batches))


class GlobalShuffle:
    """Shuffles with the global python `random`, seeded differently on each process."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = batches

    def __iter__(self):
        random.seed(3000 + accelerator.process_index)
        return iter(random.sample(self.batches, len(self.batches)))


loader = accelerator.prepare(CountingLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True))
epochs = []
for epoch in range(2):
    epochs.append([int(i) for (batch,) in loader for i in batch])

# 7 batches of 2 samples (14 samples), 7 % 2 != 0: sharded, the last round completed
batch_list = BatchList([torch.arange(2 * i, 2 * i + 2) for i in range(7)])
prepared = accelerator.prepare(batch_list)
iterable_epochs = []
for epoch in range(2):
    prepared.init_epoch()
    iterable_epochs.append([[int(i) for i in batch] for batch in prepared])
iterable = {
    "same_object": prepared is batch_list,
    "len": len(prepared),
    "epoch_seen_by_source": batch_list.epoch,
    "epochs": iterable_epochs,
}

results: dict[str, str] = {}
sources = {
    "python_list": [torch.arange(2), torch.arange(2, 4), torch.arange(4, 6)],
    "dataset": TensorDataset(torch.arange(4)),  # iterable through __getitem__, no __iter__
    "own_generator_shuffle": OwnGeneratorShuffle([torch.arange(2 * i, 2 * i + 2) for i in range(6)]),
    "kept_state_shuffle": KeptStateShuffle([torch.arange(2 * i, 2 * i + 2) for i in range(6)]),
    "global_shuffle": GlobalShuffle([torch.arange(2 * i, 2 * i + 2) for i in range(6)]),
}
for name, source in sources.items():
    try:
        prepared_source = accelerator.prepare(source)
        batches = [[int(i) for i in batch] for batch in prepared_source]
    except PrepareError as error:
        results[name] = str(error)
    else:
        results[name] = "unchanged" if prepared_source is source else json.dumps(batches)
try:
    split = Accelerator(split_batches=True).prepare([torch.arange(2), torch.arange(2, 4)])
    results["split_batches"] = "unchanged" if isinstance(split, list) else "changed"
except PrepareError as error:
    results["split_batches"] = str(error)
passed = accelerator.prepare(None)
results["none"] = "unchanged" if passed is None else "changed"

(out_dir / f"rank{accelerator.process_index}.json").write_text(
    json.dumps({"epochs": epochs, "iterable": iterable, "results": results}))
