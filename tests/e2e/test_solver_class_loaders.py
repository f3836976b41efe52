"""End to end: a solver class in stargan's shape (the loaders built by `main` and handed to the
constructor, the device chosen on `self.device` in the constructor, the models and optimizer built
by a `build_model` method the constructor calls, batches drawn with `next(iter(loader))` in a
`for step in range(num_steps)` loop) is migrated with the CLI and trains on 1 and 2 processes.

Before: the device held on `self` was not seen, so `build_model` got `Accelerator(cpu=True)`, the
model moves to `self.device` stayed after `prepare`, and the loaders were reported as "no
DataLoader feeds this training step": every rank trained on all the data. Now the constructor
creates `self.accelerator` where it chose the device (`self.device = self.accelerator.device`),
`build_model` prepares the model, the optimizer and both loaders held on the instance, and the
moves of the model are gone.

Checked: one process prints the same losses as the original (same seed, bit-identical); two gloo
processes each draw disjoint halves of every pass over the data (their union is the whole data
set), run the same number of steps, and end with equal weights.
"""

from __future__ import annotations

import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180
SAMPLES, BATCH, STEPS = 48, 4, 24
LOSS = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)

SCRIPT = '''
    """A solver class handed its loaders, choosing its device in its constructor (synthetic data)."""
    import argparse
    import os

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset


    def get_loader(samples, batch_size):
        x = torch.randn(samples, 6)
        ids = torch.arange(samples)
        return DataLoader(TensorDataset(ids, x, x.sum(dim=1, keepdim=True)), batch_size=batch_size, shuffle=True)


    class Solver:
        def __init__(self, train_loader, extra_loader, config):
            self.train_loader = train_loader
            self.extra_loader = extra_loader
            self.num_steps = config.num_steps
            self.lr = config.lr
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.build_model()

        def build_model(self):
            self.net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
            self.optimizer = torch.optim.SGD(self.net.parameters(), lr=self.lr)
            self.net.to(self.device)

        def train(self):
            loader = self.train_loader if self.extra_loader is None else self.extra_loader
            data_iter = iter(loader)
            seen = []
            for step in range(self.num_steps):
                try:
                    ids, x, y = next(data_iter)
                except StopIteration:
                    data_iter = iter(loader)
                    ids, x, y = next(data_iter)
                seen.append(ids.tolist())
                x = x.to(self.device)
                y = y.to(self.device)
                loss = nn.functional.mse_loss(self.net(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                print(f"step {step} loss {loss.item():.6f}")
            weights = sum(p.detach().double().abs().sum().item() for p in self.net.parameters())
            with open(f"seen-{os.environ.get('RANK', '0')}.txt", "w") as f:
                f.write(repr((seen, weights)))


    def main(config):
        torch.manual_seed(0)
        train_loader = get_loader(48, 4)
        extra_loader = None
        if config.extra:
            extra_loader = get_loader(24, 4)
        solver = Solver(train_loader, extra_loader, config)
        solver.train()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--num_steps", type=int, default=24)
        parser.add_argument("--lr", type=float, default=0.05)
        parser.add_argument("--extra", action="store_true")
        main(parser.parse_args())
'''


@lru_cache(maxsize=None)
def _workdir(tmp_root: str) -> Path:
    return migrate_into(Path(tmp_root), "solver.py", SCRIPT, TIMEOUT)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _workdir(str(tmp_path_factory.mktemp("solver_class_loaders")))


def _run(folder: Path, which: str, nproc: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    return run_copy(folder, which, "solver.py", nproc, TIMEOUT)


def _seen(run_dir: Path, rank: int) -> tuple[list[list[int]], float]:
    import ast

    return ast.literal_eval((run_dir / f"seen-{rank}.txt").read_text())


def test_the_accelerator_is_created_where_the_class_chooses_its_device(folder: Path) -> None:
    migrated = (folder / "migrated" / "solver.py").read_text()
    assert ("        self.accelerator = Accelerator()\n"
            "        self.device = self.accelerator.device\n") in migrated
    assert "cpu=True" not in migrated
    assert ("self.net, self.optimizer, self.train_loader, self.extra_loader = self.accelerator.prepare(\n"
            "            self.net, self.optimizer, self.train_loader, self.extra_loader\n") in migrated
    assert "self.net.to(" not in migrated  # no move of the model after prepare
    assert "self.accelerator.backward(loss)" in migrated


def test_one_process_trains_like_the_original(folder: Path) -> None:
    original, original_dir = _run(folder, "original", 1)
    migrated, run_dir = _run(folder, "migrated", 1)
    assert len(LOSS.findall(original.stdout)) == STEPS
    assert migrated.stdout == original.stdout
    assert _seen(run_dir, 0) == _seen(original_dir, 0)


def test_two_processes_each_draw_half_of_every_pass(folder: Path) -> None:
    proc, run_dir = _run(folder, "migrated", 2)
    assert [int(s) for s, _ in LOSS.findall(proc.stdout)] == list(range(STEPS))  # the main process only
    (seen0, weights0), (seen1, weights1) = _seen(run_dir, 0), _seen(run_dir, 1)
    per_pass = SAMPLES // BATCH // 2  # each rank's batches in one pass over the data
    assert len(seen0) == len(seen1) == STEPS
    for start in range(0, STEPS, per_pass):
        first = {i for batch in seen0[start:start + per_pass] for i in batch}
        second = {i for batch in seen1[start:start + per_pass] for i in batch}
        assert not first & second and first | second == set(range(SAMPLES))
    assert weights0 == weights1  # the prepared model keeps both ranks' weights equal
