"""A best-model keeper class of the script saves the weights from its method, called in the epoch
loop; the training function loads them back after the loop. Migrated with the CLI, the keeper
saves on the main process only, so the caller waits for it (`accelerator.wait_for_everyone()`
before `torch.load`, migrate/rules/checkpoints_and_output.py): on 1 process it prints and keeps the
same weights as the original, on 2 gloo processes both ranks load the checkpoint the main process
wrote last (without the barrier a rank could read it while it was written, or an older one)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class BestKeeper:
    def __init__(self, path):
        self.path = path
        self.best = float("inf")

    def update(self, val_loss, model):
        if val_loss < self.best:
            self.best = val_loss
            torch.save(model.state_dict(), self.path)


def fit(model, optimizer, loader, valid, epochs):
    keeper = BestKeeper("best.pt")
    for epoch in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(valid[0]), valid[1]).item()
        print(f"epoch {epoch} val {val_loss:.6f}")
        keeper.update(val_loss, model)
    model.load_state_dict(torch.load("best.pt"))
    return model


def main():
    torch.manual_seed(0)
    x = torch.randn(4000, 16)
    y = x @ torch.randn(16, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    fit(model, optimizer, loader, (x[:200], y[:200]), 4)
    rank = os.environ.get("RANK", "0")
    with open(f"weights_rank{rank}.txt", "w") as f:
        f.write(repr(sum(p.sum().item() for p in model.parameters())))


if __name__ == "__main__":
    main()
'''


def test_keeper_save_then_caller_reload_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated_text = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.wait_for_everyone()\n    model.load_state_dict(torch.load(\"best.pt\"))" in migrated_text
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, migrated_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "epoch 3 val" in original.stdout
    assert (original_dir / "weights_rank0.txt").read_text() == (migrated_dir / "weights_rank0.txt").read_text()
    two, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert "epoch 3 val" in two.stdout
    saved = torch.load(two_dir / "best.pt")
    assert sorted(saved) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # the user's keys
    expected = repr(sum(t.sum().item() for t in saved.values()))
    for rank in (0, 1):
        assert (two_dir / f"weights_rank{rank}.txt").read_text() == expected
