"""A project checkpoint helper the migration cannot read, handed the prepared model (issue 29).

The script resumes and saves through `ckpt_tools` (a module outside the migrated folder, so the
codemod cannot read it), handing it the model and optimizer after the prepare call. Under
`--target runtime` the codemod hands it the prepared objects as they are (no AM004 report:
migrate/roles/unread_handoffs.py), because the runtime's prepared model has the user's keys on
any number of processes. Checked at 2 gloo processes: the helper's checkpoint holds the user's
keys and loads with `strict=True` into the user's class; a second run resumes from it through the
helper's own `strict=True` load; and a checkpoint written by the original single-process script
resumes the migrated one at 2 processes.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

HELPER = '''
import os

import torch


def resume(path, model, optimizer):
    """The epoch to start from: 0, or the saved one after loading the saved states strictly."""
    if not os.path.exists(path):
        return 0
    checkpoint = torch.load(path, map_location="cpu")
    model.load_state_dict(checkpoint["model"], strict=True)
    optimizer.load_state_dict(checkpoint["optimizer"])
    print(f"resumed at epoch {checkpoint['epoch']}")
    return checkpoint["epoch"]


def save(path, model, optimizer, epoch):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, temp)
    os.replace(temp, path)
'''

SCRIPT = '''
import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ckpt_tools


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    start = ckpt_tools.resume(os.path.join(args.out, "last.pth"), model=net, optimizer=optimizer)
    for epoch in range(start, start + 2):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        ckpt_tools.save(os.path.join(args.out, "last.pth"), model=net, optimizer=optimizer, epoch=epoch + 1)
    print(f"trained to epoch {start + 2}")


if __name__ == "__main__":
    main()
'''

USER_KEYS = ["0.bias", "0.weight", "2.bias", "2.weight"]


def user_model_loads(path: Path) -> None:
    checkpoint = torch.load(path, map_location="cpu")
    assert sorted(checkpoint["model"]) == USER_KEYS
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    outcome = model.load_state_dict(checkpoint["model"], strict=True)
    assert not outcome.missing_keys and not outcome.unexpected_keys


def test_helper_handed_the_prepared_model_saves_user_keys_and_resumes_strictly(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.prepare(" in migrated
    assert "ckpt_tools.resume(os.path.join(args.out, \"last.pth\"), model=net, optimizer=optimizer)" in migrated
    for which in ("original", "migrated"):
        (folder / which / "ckpt_tools.py").write_text(HELPER)

    # 2 processes, from scratch: the helper writes the user's keys
    first, run_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert "resumed" not in first.stdout and "trained to epoch 2" in first.stdout
    user_model_loads(run_dir / "runs" / "last.pth")
    # 2 processes again: the helper's strict load of that checkpoint into the prepared model
    second, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert "resumed at epoch 2" in second.stdout and "trained to epoch 4" in second.stdout
    user_model_loads(run_dir / "runs" / "last.pth")

    # the original's checkpoint (1 process) resumes the migrated script at 2 processes
    _, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    shutil.rmtree(run_dir / "runs")
    shutil.copytree(original_dir / "runs", run_dir / "runs")
    third, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert "resumed at epoch 2" in third.stdout and "trained to epoch 4" in third.stdout
