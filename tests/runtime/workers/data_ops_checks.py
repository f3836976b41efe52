"""Worker for test_data_extra.py and test_ops.py: run under torchrun with 2 processes.

Writes OUT_DIR/rank{r}.json with everything the tests assert on.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from runtime import Accelerator, DataLoaderConfiguration
from runtime.errors import PrepareError

out_dir = Path(sys.argv[1])
accelerator = Accelerator()
rank, n = accelerator.process_index, accelerator.num_processes
torch.manual_seed(100 + rank)  # different RNG per rank: only the runtime can make orders agree
result: dict = {}


def ids(batch) -> list[int]:
    return batch[0].tolist() if isinstance(batch, (list, tuple)) else batch.tolist()


def epoch_of(loader) -> list[list[int]]:
    return [ids(b) for b in loader]


# -- split_batches: rank r gets slice r of every global batch, in the one-process order ---------
split = {}
for size, shuffle in ((64, True), (70, True), (67, False)):
    dataset = TensorDataset(torch.arange(size))
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))
    loader = acc.prepare(DataLoader(dataset, batch_size=8, shuffle=shuffle))
    epochs, references, gathered = [], [], []
    for _ in range(2):
        before = torch.get_rng_state()
        mine, gathered_ids, gathered_str = [], [], []
        for batch in loader:
            mine.append(ids(batch))
            gathered_ids += acc.gather_for_metrics(batch[0]).tolist()
            gathered_str += acc.gather_for_metrics([f"s{i}" for i in ids(batch)])
        epochs.append(mine)
        gathered.append([gathered_ids, gathered_str])
        torch.set_rng_state(before)
        references.append(epoch_of(DataLoader(dataset, batch_size=8, shuffle=shuffle)))
    split[str(size)] = {"epochs": epochs, "reference": references, "gathered": gathered,
                        "len": len(loader)}
result["split"] = split

try:
    Accelerator(split_batches=True).prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=7))
    result["split_error"] = None
except PrepareError as error:
    result["split_error"] = str(error)

# -- even_batches=False: ranks may get different numbers of batches -----------------------------
acc = Accelerator(even_batches=False)
loader = acc.prepare(DataLoader(TensorDataset(torch.arange(68)), batch_size=8))
result["uneven"] = {"len": len(loader), "epoch": epoch_of(loader)}
# split + uneven: the last batch (3 samples) is cut 1 / 2; gather_for_metrics copes.
acc = Accelerator(split_batches=True, even_batches=False)
loader = acc.prepare(DataLoader(TensorDataset(torch.arange(67)), batch_size=8))
got = []
for batch in loader:
    got += acc.gather_for_metrics(batch[0]).tolist()
result["uneven_split"] = {"epoch": epoch_of(loader), "gathered": got}


# -- IterableDataset ------------------------------------------------------------------------------
class Stream(IterableDataset):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        return iter(torch.arange(self.size).tolist())


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.size


iterable = {}
for name, ds, kwargs in (
    ("unsized", Stream(70), dict(batch_size=8)),
    ("sized", SizedStream(70), dict(batch_size=8)),
    ("split", Stream(70), dict(batch_size=8, split=True)),
    ("drop_last", Stream(70), dict(batch_size=8, drop_last=True)),
):
    split_flag = kwargs.pop("split", False)
    acc = Accelerator(split_batches=split_flag)
    loader = acc.prepare(DataLoader(ds, **kwargs))
    batches, gathered, ends = [], [], []
    for batch in loader:
        batches.append(batch.tolist())
        gathered += acc.gather_for_metrics(batch).tolist()
    iterable[name] = {"batches": batches, "gathered": gathered}
result["iterable"] = iterable

# -- gather_for_metrics, non-split, objects -------------------------------------------------------
acc = Accelerator()
loader = acc.prepare(DataLoader(TensorDataset(torch.arange(70)), batch_size=8, shuffle=True))
strings, tensors, nested = [], [], []
for batch in loader:
    strings += acc.gather_for_metrics([f"x{i}" for i in ids(batch)])
    tensors += acc.gather_for_metrics(batch[0]).tolist()
    nested_batch = acc.gather_for_metrics({"i": batch[0], "sq": batch[0] ** 2})
    nested += list(zip(nested_batch["i"].tolist(), nested_batch["sq"].tolist()))
result["gfm"] = {"strings": strings, "tensors": tensors, "nested": nested}

# -- ops ----------------------------------------------------------------------------------------
t = torch.tensor([1.0, 2.0]) * (rank + 1)
result["reduce_sum"] = accelerator.reduce(t, reduction="sum").tolist()
result["reduce_mean"] = accelerator.reduce(t, reduction="mean").tolist()
result["reduce_nested"] = {k: v.tolist() for k, v in accelerator.reduce(
    {"a": torch.tensor([rank]), "b": torch.tensor([2 * rank + 1])}, reduction="sum").items()}
result["reduce_scale"] = accelerator.reduce(t, reduction="sum", scale=0.5).tolist()
result["reduce_input_untouched"] = t.tolist()
try:
    accelerator.reduce(t, reduction="max")
    result["reduce_error"] = None
except Exception as error:  # noqa: BLE001
    result["reduce_error"] = f"{type(error).__name__}: {error}"

ragged = torch.full((rank + 1, 2), rank + 1)
result["pad"] = accelerator.pad_across_processes(ragged).tolist()
result["pad_first"] = accelerator.pad_across_processes(ragged, pad_index=-1, pad_first=True).tolist()
seq = torch.arange(3 + 2 * rank)[None]
result["pad_dim1_gathered"] = accelerator.gather(accelerator.pad_across_processes(seq, dim=1)).tolist()
result["pad_0d"] = accelerator.pad_across_processes(torch.tensor(5)).tolist()

Point = __import__("collections").namedtuple("Point", "x y")
gathered = accelerator.gather({"p": Point(torch.tensor([rank]), [torch.tensor([[rank, rank]])]),
                               "s": torch.tensor(rank)})
result["gather_nested"] = {"x": gathered["p"].x.tolist(), "y": gathered["p"].y[0].tolist(),
                           "s": gathered["s"].tolist(), "type": type(gathered["p"]).__name__}

# main_process_first: the main process's block finishes before any other process enters.
marker = out_dir / "main_first.marker"
with accelerator.main_process_first():
    if accelerator.is_main_process:
        time.sleep(1.0)
        marker.write_text("main was here")
    result["main_first_marker_seen"] = marker.exists()

calls = []


@accelerator.on_main_process
def on_main(x):
    calls.append("main")
    return x * 2


@accelerator.on_local_main_process
def on_local_main():
    calls.append("local_main")


@accelerator.on_process(process_index=1)
def on_one():
    calls.append("one")


@accelerator.on_last_process
def on_last():
    calls.append("last")


result["on_main_return"] = on_main(21)
on_local_main()
on_one()
on_last()
result["decorator_calls"] = calls

# free_memory: drops the Accelerator's references and returns Nones for the caller's.
acc = Accelerator()
model = acc.prepare(nn.Linear(2, 2))
optimizer = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
before = len(acc._models)
model, optimizer = acc.free_memory(model, optimizer)
result["free_memory"] = {"before": before, "after": len(acc._models), "returned": [model, optimizer],
                         "optimizers_after": len(getattr(acc, "_optimizers", []))}

# A loader prepared before free_memory() (an evaluation loader kept across folds) and iterated
# after it: gather_for_metrics still drops the samples even_batches padded on (5 samples, 2 ranks).
kept = acc.prepare(DataLoader(torch.arange(5.0), batch_size=2))
acc.free_memory()
result["free_memory_kept_loader"] = sorted(
    int(v) for batch in kept for v in acc.gather_for_metrics(batch).tolist()
)

(out_dir / f"rank{rank}.json").write_text(json.dumps(result))
accelerator.end_training()
