"""Worker for tests/runtime/test_prepare_non_loader.py: what prepare() does with batch sources that
are not torch DataLoaders, and with a DataLoader subclass.

Run under torchrun (1 or 2 processes); writes OUT_DIR/rank{r}.json: the samples this rank drew
from a prepared DataLoader subclass over two epochs, and, for each non-DataLoader iterable, either
"unchanged" (prepare returned the very object) or the PrepareError's message.
"""

from __future__ import annotations

import json
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
    """A batch source of the script's own, iterable but no DataLoader (a torchtext-style iterator)."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


loader = accelerator.prepare(CountingLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True))
epochs = []
for epoch in range(2):
    epochs.append([int(i) for (batch,) in loader for i in batch])

results: dict[str, str] = {}
sources = {
    "batch_list": BatchList([torch.arange(2), torch.arange(2, 4)]),
    "python_list": [torch.arange(2), torch.arange(2, 4)],
    "dataset": TensorDataset(torch.arange(4)),  # iterable through __getitem__, no __iter__
}
for name, source in sources.items():
    try:
        prepared = accelerator.prepare(source)
    except PrepareError as error:
        results[name] = str(error)
    else:
        results[name] = "unchanged" if prepared is source else f"changed to {type(prepared).__name__}"
passed = accelerator.prepare(None)
results["none"] = "unchanged" if passed is None else "changed"

(out_dir / f"rank{accelerator.process_index}.json").write_text(json.dumps({"epochs": epochs, "results": results}))
