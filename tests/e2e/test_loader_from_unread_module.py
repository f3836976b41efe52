"""End to end: the loader a training loop iterates comes from another module the migration is not
given (`from shard_data import get_loader`, the module written beside the script only after it is
migrated), so the migration cannot read what it builds. The loop is what makes it the loader: it is
prepared (its batches keep their moves), and the runtime decides at run time.

Checked, migrated with the CLI and run on 1 and 2 gloo processes:
- `get_loader` returns a torch DataLoader: one process prints the original's losses and draws the
  original's samples; two processes each train half of every epoch (disjoint, together every
  sample once), end with equal weights, and only the main process prints;
- `get_loader` returns an iterable that is not a DataLoader: one process trains like the original;
  on two processes the runtime shares its batches out (batch i to rank i % 2: each half of every
  epoch, disjoint, equal weights), where HF Accelerate would have let every process train on all
  of it.

Before: "training loop iterates `data_loader`, which is not a recognised DataLoader"; the loader
was left unprepared, and every process trained on the whole data set.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into, run_copy  # noqa: E402
from rt_helpers import torchrun  # noqa: E402

TIMEOUT = 180
SAMPLES, BATCH, EPOCHS = 48, 6, 2
LINE = re.compile(r"^epoch (\d+) loss ([0-9.]+)$", re.M)

SCRIPT = '''
    """Trains on the loader another module builds."""
    import os

    import torch
    import torch.nn as nn

    from shard_data import get_loader


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(0)
        data_loader = get_loader(48, batch_size=6)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for epoch in range(2):
            for ids, x, y in data_loader:
                seen.extend(ids.tolist())
                x, y = x.to(device), y.to(device)
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.6f}")
        weights = sum(p.detach().double().abs().sum().item() for p in model.parameters())
        with open(f"seen-{os.environ.get('RANK', '0')}.txt", "w") as f:
            f.write(repr((seen, weights)))


    if __name__ == "__main__":
        main()
'''

DATA_LOADER = '''
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def get_loader(n, batch_size):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, 4, generator=g)
        return DataLoader(TensorDataset(torch.arange(n), x, (x[:, 0] > 0).long()), batch_size=batch_size, shuffle=True)
'''

BATCH_LIST = '''
    import torch


    class BatchList:
        """Batches made ahead of time: iterable, but no torch DataLoader."""

        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return iter(self.batches)

        def __len__(self):
            return len(self.batches)


    def get_loader(n, batch_size):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, 4, generator=g)
        ids, y = torch.arange(n), (x[:, 0] > 0).long()
        return BatchList([(ids[i:i + batch_size], x[i:i + batch_size], y[i:i + batch_size])
                          for i in range(0, n, batch_size)])
'''


def _prepare(root: Path, data_module: str) -> Path:
    folder = migrate_into(root, "train.py", SCRIPT, TIMEOUT)
    for which in ("original", "migrated"):  # beside each copy, after the migration: never read by it
        (folder / which / "shard_data.py").write_text(textwrap.dedent(data_module).lstrip())
    return folder


@pytest.fixture(scope="module")
def loader_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _prepare(tmp_path_factory.mktemp("unread_loader"), DATA_LOADER)


@pytest.fixture(scope="module")
def iterable_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _prepare(tmp_path_factory.mktemp("unread_iterable"), BATCH_LIST)


def _seen(run_dir: Path, rank: int) -> tuple[list[int], float]:
    return ast.literal_eval((run_dir / f"seen-{rank}.txt").read_text())


def test_the_loader_from_the_unread_module_is_prepared(loader_folder: Path) -> None:
    migrated = (loader_folder / "migrated" / "train.py").read_text()
    assert "model, optimizer, data_loader = accelerator.prepare(model, optimizer, data_loader)" in migrated
    assert "x, y = x.to(device), y.to(device)" in migrated  # kept: it may not be a DataLoader


def test_one_process_trains_like_the_original(loader_folder: Path) -> None:
    original, original_dir = run_copy(loader_folder, "original", "train.py", 1, TIMEOUT)
    migrated, run_dir = run_copy(loader_folder, "migrated", "train.py", 1, TIMEOUT)
    assert len(LINE.findall(original.stdout)) == EPOCHS
    assert migrated.stdout == original.stdout
    assert _seen(run_dir, 0) == _seen(original_dir, 0)


def test_two_processes_each_train_half_of_every_epoch(loader_folder: Path) -> None:
    proc, run_dir = run_copy(loader_folder, "migrated", "train.py", 2, TIMEOUT)
    assert [int(e) for e, _ in LINE.findall(proc.stdout)] == list(range(EPOCHS))  # the main process only
    (seen0, weights0), (seen1, weights1) = _seen(run_dir, 0), _seen(run_dir, 1)
    per_epoch = SAMPLES // 2
    assert len(seen0) == len(seen1) == EPOCHS * per_epoch
    for epoch in range(EPOCHS):
        first = set(seen0[epoch * per_epoch:(epoch + 1) * per_epoch])
        second = set(seen1[epoch * per_epoch:(epoch + 1) * per_epoch])
        assert not first & second and first | second == set(range(SAMPLES))
    assert weights0 == weights1


def test_a_non_dataloader_trains_on_one_process(iterable_folder: Path) -> None:
    original, original_dir = run_copy(iterable_folder, "original", "train.py", 1, TIMEOUT)
    migrated, run_dir = run_copy(iterable_folder, "migrated", "train.py", 1, TIMEOUT)
    assert len(LINE.findall(original.stdout)) == EPOCHS
    assert migrated.stdout == original.stdout
    assert _seen(run_dir, 0) == _seen(original_dir, 0)


def test_a_non_dataloader_is_shared_out_on_two_processes(iterable_folder: Path) -> None:
    run_dir = iterable_folder / "migrated-2"
    run_dir.mkdir()
    proc: subprocess.CompletedProcess[str] = torchrun(
        iterable_folder / "migrated" / "train.py", cwd=run_dir, nproc=2, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [int(e) for e, _ in LINE.findall(proc.stdout)] == list(range(EPOCHS))  # the main process only
    (seen0, weights0), (seen1, weights1) = _seen(run_dir, 0), _seen(run_dir, 1)
    per_epoch = SAMPLES // 2
    assert len(seen0) == len(seen1) == EPOCHS * per_epoch
    for epoch in range(EPOCHS):
        first = seen0[epoch * per_epoch:(epoch + 1) * per_epoch]
        second = seen1[epoch * per_epoch:(epoch + 1) * per_epoch]
        assert first == [i for b in range(0, SAMPLES // BATCH, 2) for i in range(b * BATCH, (b + 1) * BATCH)]
        assert not set(first) & set(second) and set(first) | set(second) == set(range(SAMPLES))
    assert weights0 == weights1
