"""End to end: a trainer class whose `train(train_loader)` `main` calls on an instance (SimCLR's
shape: `trainer = Trainer(model=model, optimizer=optimizer, scheduler=scheduler, args=args)` then
`trainer.train(train_loader)`), with a cosine scheduler sized by the loader
(`T_max=len(train_loader)`) and stepped once per epoch, migrated with the CLI and run on 1 and 2
processes.

Before: the loop's `train_loader` was read as a parameter nobody passes ("not bound in main"), so
it was left unprepared and every rank trained on the whole data set. Now `main` prepares it with
the model and the optimizer, after the scheduler, which keeps the unprepared length as its
`T_max` (the original's schedule).

Checked: one process prints the same losses and learning rates as the original; two gloo
processes each run half of every epoch's batches (disjoint samples, together the whole data set),
follow the original's learning-rate schedule, and end with equal weights.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180
SAMPLES, BATCH, EPOCHS = 64, 8, 3
LINE = re.compile(r"^epoch (\d+) loss ([0-9.]+) lr ([0-9.e-]+)$", re.M)

SCRIPT = '''
    """A trainer whose `train(loader)` main calls, with an epoch scheduler sized by the loader."""
    import argparse
    import os

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    class Trainer:
        def __init__(self, *args, **kwargs):
            self.args = kwargs["args"]
            self.model = kwargs["model"]
            self.optimizer = kwargs["optimizer"]
            self.scheduler = kwargs["scheduler"]

        def train(self, train_loader):
            seen = []
            for epoch in range(self.args.epochs):
                for ids, x, y in train_loader:
                    seen.extend(ids.tolist())
                    x, y = x.to(self.args.device), y.to(self.args.device)
                    loss = nn.functional.cross_entropy(self.model(x), y)
                    self.optimizer.zero_grad()
                    loss.backward()
                    self.optimizer.step()
                self.scheduler.step()
                print(f"epoch {epoch} loss {loss.item():.6f} lr {self.scheduler.get_last_lr()[0]:.8f}")
            weights = sum(p.detach().double().abs().sum().item() for p in self.model.parameters())
            with open(f"seen-{os.environ.get('RANK', '0')}.txt", "w") as f:
                f.write(repr((seen, weights)))


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=3)
        parser.add_argument("--disable-cuda", action="store_true")
        args = parser.parse_args()
        if not args.disable_cuda and torch.cuda.is_available():
            args.device = torch.device("cuda")
        else:
            args.device = torch.device("cpu")
        torch.manual_seed(0)
        x = torch.randn(64, 8)
        data = TensorDataset(torch.arange(64), x, (x[:, 0] > 0).long())
        loader = DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(args.device)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(loader), eta_min=0)
        trainer = Trainer(model=model, optimizer=optimizer, scheduler=scheduler, args=args)
        trainer.train(loader)


    if __name__ == "__main__":
        main()
'''


@lru_cache(maxsize=None)
def _workdir(tmp_root: str) -> Path:
    return migrate_into(Path(tmp_root), "trainer.py", SCRIPT, TIMEOUT)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _workdir(str(tmp_path_factory.mktemp("trainer_method_loader")))


def _run(folder: Path, which: str, nproc: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    return run_copy(folder, which, "trainer.py", nproc, TIMEOUT)


def _seen(run_dir: Path, rank: int) -> tuple[list[int], float]:
    return ast.literal_eval((run_dir / f"seen-{rank}.txt").read_text())


def test_main_prepares_the_loader_after_the_scheduler_sized_by_it(folder: Path) -> None:
    migrated = (folder / "migrated" / "trainer.py").read_text()
    scheduler = migrated.index("T_max=len(loader)")
    prepare = migrated.index("model, optimizer, loader = accelerator.prepare(model, optimizer, loader)")
    assert scheduler < prepare < migrated.index("trainer.train(loader)")
    assert "self.accelerator.backward(loss)" in migrated


def test_one_process_trains_like_the_original(folder: Path) -> None:
    original, original_dir = _run(folder, "original", 1)
    migrated, run_dir = _run(folder, "migrated", 1)
    assert len(LINE.findall(original.stdout)) == EPOCHS
    assert migrated.stdout == original.stdout
    assert _seen(run_dir, 0) == _seen(original_dir, 0)


def test_two_processes_each_train_half_of_every_epoch(folder: Path) -> None:
    original, _ = _run(folder, "original", 1)
    proc, run_dir = _run(folder, "migrated", 2)
    lines = LINE.findall(proc.stdout)
    assert [int(e) for e, _, _ in lines] == list(range(EPOCHS))  # the main process only
    # the schedule is the original's: T_max from the unprepared loader, one step per epoch
    assert [lr for _, _, lr in lines] == [lr for _, _, lr in LINE.findall(original.stdout)]
    (seen0, weights0), (seen1, weights1) = _seen(run_dir, 0), _seen(run_dir, 1)
    per_epoch = SAMPLES // 2
    assert len(seen0) == len(seen1) == EPOCHS * per_epoch
    for epoch in range(EPOCHS):
        first = set(seen0[epoch * per_epoch:(epoch + 1) * per_epoch])
        second = set(seen1[epoch * per_epoch:(epoch + 1) * per_epoch])
        assert not first & second and first | second == set(range(SAMPLES))
    assert weights0 == weights1
