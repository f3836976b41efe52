"""A contrastive-demo shape (MoCo's CIFAR-10 notebook): the epoch function weights its running
loss by `data_loader.batch_size`, and the loop counts steps by an option (`done += args.every`,
WGAN-GP's `batches_done += opt.n_critic`) to decide when to save. Migrated with the CLI: no
report (the counter is the same on every process), the same lines as the original on 1 process
(the prepared loader keeps `batch_size`), and at 2 processes both ranks finish every epoch and
the snapshots are written once, by the main process."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--every", type=int, default=2)
args = parser.parse_args()


def train(net, data_loader, optimizer, done):
    total_loss, total_num = 0.0, 0
    for x, y in data_loader:
        loss = nn.functional.mse_loss(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total_num += data_loader.batch_size
        total_loss += loss.item() * data_loader.batch_size
        done += args.every
        if done % 8 == 0:
            torch.save(net.state_dict(), f"snap_{done}.pt")
    return total_loss / total_num, done


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(48, 4), torch.randn(48, 1)), batch_size=6, shuffle=True, drop_last=True)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
done = 0
for epoch in range(3):
    loss, done = train(model, loader, optimizer, done)
    print(f"epoch {epoch} loss {loss:.6f} done {done}")
'''


def test_batch_size_and_option_counter_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated_text = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.reduce" not in migrated_text  # `done` counts steps: the same on every rank
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout and "epoch 2 loss" in original.stdout
    assert sorted(p.name for p in one_dir.glob("snap_*.pt")) == sorted(p.name for p in original_dir.glob("snap_*.pt"))
    two, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    lines = [line for line in two.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(" loss")[0] for line in lines] == ["epoch 0", "epoch 1", "epoch 2"]
    assert lines[-1].endswith("done 24")  # 4 batches per rank per epoch, 2 per step, 3 epochs
    assert sorted(p.name for p in two_dir.glob("snap_*.pt")) == ["snap_16.pt", "snap_24.pt", "snap_8.pt"]
