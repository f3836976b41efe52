"""Accuracy over loaders built by another library's DataLoader (`torch_geometric.loader.DataLoader`,
PyG's graph-classification examples), on 1 and 2 processes (AM010).

The training step shows that this callable builds the batches, so the evaluation over the training
loader (prepared, each process its share) and over the test loader built by the same callable are
gathered like torch DataLoaders' (before, neither was: each rank's "train accuracy" counted its own
half of the samples over the whole data set's length, silently). torch_geometric is not installed
here: a fake `torch_geometric.loader.DataLoader`, a subclass of torch's with a collate function of
its own, is put on PYTHONPATH. Evaluated before training (the same weights everywhere), with a
training set (37 samples, batches of 4) that 2 processes cannot split evenly, both accuracies must
equal those computed on the whole tensors on every rank, and the migrated script must print what
the original prints on one process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script  # noqa: E402

TIMEOUT = 180

FAKE_LOADER = '''
import torch


def _collate(items):
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


class DataLoader(torch.utils.data.DataLoader):
    def __init__(self, dataset, batch_size=1, shuffle=False, **kwargs):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, collate_fn=_collate, **kwargs)
'''

SCRIPT = '''
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from torch_geometric.loader import DataLoader

torch.manual_seed(0)
points = torch.randn(50, 6)
labels = (points[:, 0] + 0.3 * points[:, 1] > 0).long()
train_loader = DataLoader(TensorDataset(points[:37], labels[:37]), batch_size=4)
test_loader = DataLoader(TensorDataset(points[37:], labels[37:]), batch_size=4)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(6, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def train():
    model.train()
    for x, y in train_loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


@torch.no_grad()
def accuracy(loader):
    model.eval()
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(dim=1) == y).sum().item()
    return correct / len(loader.dataset)


@torch.no_grad()
def reference(first, last):
    model.eval()
    return (model(points[first:last].to(device)).argmax(dim=1) == labels[first:last].to(device)).sum().item() / (last - first)


result = {
    "train": accuracy(train_loader), "test": accuracy(test_loader),
    "train_ref": reference(0, 37), "test_ref": reference(37, 50),
}
print(f"train {result['train']:.6f} test {result['test']:.6f}")
train()
with open(os.path.join(sys.argv[1], f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
    json.dump(result, f)
'''


def _run(fakes: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir()
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = ["env", f"PYTHONPATH={fakes}", *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_accuracy_over_loaders_of_the_training_kind_is_gathered(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    (fakes / "torch_geometric").mkdir(parents=True)
    (fakes / "torch_geometric" / "__init__.py").write_text("")
    (fakes / "torch_geometric" / "loader.py").write_text(FAKE_LOADER)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert "accelerator.prepare(\n    model, optimizer, train_loader, test_loader\n)" in text, text
    assert "accelerator.gather_for_metrics(model(x))" in text, text

    before, [plain] = _run(fakes, original, tmp_path / "original", None)
    one, [single] = _run(fakes, migrated, tmp_path / "one", None)
    assert one.stdout == before.stdout and single == plain, (before.stdout, one.stdout)
    assert plain["train"] == plain["train_ref"] and plain["test"] == plain["test_ref"], plain

    _, ranks = _run(fakes, migrated, tmp_path / "two", 2)
    assert len(ranks) == 2, ranks
    for rank in ranks:
        assert abs(rank["train"] - plain["train_ref"]) < 1e-9, (rank, plain)
        assert abs(rank["test"] - plain["test_ref"]) < 1e-9, (rank, plain)
