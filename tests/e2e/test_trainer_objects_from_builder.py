"""End to end: the PyTorch DDP tutorial's single-device shape (a `Trainer` class handed the model
and the optimizer that `load_train_objs()` returns in a tuple, the loader of
`prepare_dataloader(dataset, batch_size)` and a device index) is migrated with the CLI and trains
on 1 and 2 processes.

Before: `accelerator.prepare` was placed in `load_train_objs` (which builds the optimizer), the
loader was left out, `Trainer` never got the accelerator, and the accelerator-bound check (AM101)
left the whole file as it was. Now `main` creates the Accelerator, prepares the model, the
optimizer and the loader after both helpers ran, and hands `accelerator` to `Trainer(...)`, which
keeps it as `self.accelerator` (backward, prints and the checkpoint go through it).

Checked: one process prints the same lines as the original (same seed: bit-identical losses, the
batch size drawn with `next(iter(self.train_data))`, the checkpoint lines) and saves an equal
checkpoint; two gloo processes each run half of every epoch's batches, only the main process
prints and writes the checkpoint, and both ranks end with the same weights.
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
LOSS = re.compile(r"^epoch (\d+) step (\d+) loss ([0-9.]+)$", re.M)
STEPS = re.compile(r"^rank (\d) steps (\d+) weights ([0-9.e+-]+)$", re.M)
SAMPLES, BATCH, EPOCHS = 96, 8, 2

SCRIPT = '''
    """Single-device training in the DDP tutorial's shape (synthetic data)."""
    import os

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset, TensorDataset


    class Trainer:
        def __init__(
            self,
            model: torch.nn.Module,
            train_data: DataLoader,
            optimizer: torch.optim.Optimizer,
            gpu_id,
            save_every: int,
        ) -> None:
            self.gpu_id = gpu_id
            self.model = model.to(gpu_id)
            self.train_data = train_data
            self.optimizer = optimizer
            self.save_every = save_every
            self.steps = 0

        def _run_batch(self, source, targets):
            self.optimizer.zero_grad()
            output = self.model(source)
            loss = F.mse_loss(output, targets)
            loss.backward()
            self.optimizer.step()
            self.steps += 1
            return loss.item()

        def _run_epoch(self, epoch):
            b_sz = len(next(iter(self.train_data))[0])
            print(f"[{self.gpu_id}] epoch {epoch} | batch size {b_sz} | steps {len(self.train_data)}")
            for step, (source, targets) in enumerate(self.train_data):
                source = source.to(self.gpu_id)
                targets = targets.to(self.gpu_id)
                loss = self._run_batch(source, targets)
                print(f"epoch {epoch} step {step} loss {loss:.6f}")

        def _save_checkpoint(self, epoch):
            ckp = self.model.state_dict()
            torch.save(ckp, "checkpoint.pt")
            print(f"epoch {epoch} | checkpoint saved at checkpoint.pt")

        def train(self, max_epochs: int):
            for epoch in range(max_epochs):
                self._run_epoch(epoch)
                if epoch % self.save_every == 0:
                    self._save_checkpoint(epoch)
            weights = sum(p.detach().double().abs().sum().item() for p in self.model.parameters())
            with open(f"steps-{os.environ.get('RANK', '0')}.txt", "w") as f:
                f.write(f"rank {os.environ.get('RANK', '0')} steps {self.steps} weights {weights!r}\\n")


    def load_train_objs():
        torch.manual_seed(0)
        x = torch.randn(96, 5)
        train_set = TensorDataset(x, x[:, :1] * 0.5 - x[:, 1:2])
        model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        return train_set, model, optimizer


    def prepare_dataloader(dataset: Dataset, batch_size: int):
        return DataLoader(dataset, batch_size=batch_size, shuffle=True)


    def main(device, total_epochs, save_every, batch_size):
        dataset, model, optimizer = load_train_objs()
        train_data = prepare_dataloader(dataset, batch_size)
        trainer = Trainer(model, train_data, optimizer, device, save_every)
        trainer.train(total_epochs)


    if __name__ == "__main__":
        device = "cpu"
        main(device, 2, 1, 8)
'''


@lru_cache(maxsize=None)
def _workdir(tmp_root: str) -> Path:
    return migrate_into(Path(tmp_root), "single_gpu.py", SCRIPT, TIMEOUT)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _workdir(str(tmp_path_factory.mktemp("trainer_objects_from_builder")))


def _run(folder: Path, which: str, nproc: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    return run_copy(folder, which, "single_gpu.py", nproc, TIMEOUT)


def _ranks(run_dir: Path) -> dict[int, tuple[int, float]]:
    found = {}
    for path in run_dir.glob("steps-*.txt"):
        (rank, steps, weights), = STEPS.findall(path.read_text())
        found[int(rank)] = (int(steps), float(weights))
    return found


def test_the_migration_prepares_in_main_and_hands_the_accelerator_to_the_trainer(folder: Path) -> None:
    migrated = (folder / "migrated" / "single_gpu.py").read_text()
    assert "accelerator = Accelerator()\n    dataset, model, optimizer = load_train_objs()" in migrated
    assert ("    train_data = prepare_dataloader(dataset, batch_size)\n"
            "    model, optimizer, train_data = accelerator.prepare(model, optimizer, train_data)\n"
            "    trainer = Trainer(model, train_data, optimizer, device, save_every, accelerator)\n") in migrated
    assert "        save_every: int,\n        accelerator,\n    ) -> None:\n        self.accelerator = accelerator\n" in migrated
    assert "self.model = model\n" in migrated and ".to(self.gpu_id)" not in migrated
    assert "self.accelerator.backward(loss)" in migrated
    assert "self.accelerator.save(ckp, \"checkpoint.pt\")" in migrated
    assert "ckp = self.accelerator.unwrap_model(self.model).state_dict()" in migrated
    assert "print(" not in migrated.replace("self.accelerator.print(", "")


def test_one_process_trains_like_the_original(folder: Path) -> None:
    import torch

    original, original_dir = _run(folder, "original", 1)
    migrated, run_dir = _run(folder, "migrated", 1)
    assert len(LOSS.findall(original.stdout)) == EPOCHS * SAMPLES // BATCH
    assert migrated.stdout == original.stdout  # every line: losses, batch sizes, checkpoint lines
    assert _ranks(run_dir) == _ranks(original_dir)
    saved, expected = torch.load(run_dir / "checkpoint.pt"), torch.load(original_dir / "checkpoint.pt")
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)


def test_two_processes_train_their_share_and_agree(folder: Path) -> None:
    proc, run_dir = _run(folder, "migrated", 2)
    steps_per_epoch = SAMPLES // BATCH
    printed = LOSS.findall(proc.stdout)
    # only the main process prints, and it runs half of every epoch
    assert [(int(e), int(s)) for e, s, _ in printed] == [
        (e, s) for e in range(EPOCHS) for s in range(steps_per_epoch // 2)]
    assert proc.stdout.count("checkpoint saved") == EPOCHS
    assert proc.stdout.count("| batch size 8 |") == EPOCHS
    ranks = _ranks(run_dir)
    assert sorted(ranks) == [0, 1]
    assert ranks[0][0] == ranks[1][0] == EPOCHS * steps_per_epoch // 2
    assert ranks[0][1] == ranks[1][1]  # the prepared model keeps both ranks' weights equal
    assert (run_dir / "checkpoint.pt").exists()
