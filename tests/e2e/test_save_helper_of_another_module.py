"""A segmentation-tutorial shape (two modules): utils.py holds `get_loaders` (the training and
validation DataLoaders), `save_checkpoint(state)` (`torch.save(state, filename)`) and a function
that saves predictions per batch with `np.save` (it runs the model, so the accelerator is handed to it: the view edits utils.py); train.py
builds the checkpoint dict and calls `save_checkpoint(checkpoint)` every epoch. Before, once the
view edited utils.py, that call was no longer known by its name and ran on every process (all
writing the same file). Now the call runs on the main process only. Migrated with the CLI and run:
1 process as the original, 2 processes write each checkpoint once (a `sitecustomize` the scripts
never see logs the process of every `torch.save` of a `.pth.tar`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import ROOT, run_copy  # noqa: E402

TIMEOUT = 180

SAVE_LOG = '''
import os

import torch

_save = torch.save


def _logged(obj, f, *args, **kwargs):
    if str(f).endswith(".pth.tar"):
        with open("saves.log", "a") as log:
            log.write(f"{os.getpid()}\\n")
    return _save(obj, f, *args, **kwargs)


torch.save = _logged
'''

UTILS = '''
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def save_checkpoint(state, filename="checkpoint.pth.tar"):
    print("=> Saving checkpoint")
    torch.save(state, filename)


def get_loaders(batch_size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, generator=g)
    y = (x.sum(1, keepdim=True) > 0).float()
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[:12], y[:12]), batch_size=batch_size)
    return train, val


def save_predictions(loader, model, device="cpu"):
    model.eval()
    for idx, (x, _) in enumerate(loader):
        x = x.to(device=device)
        with torch.no_grad():
            preds = torch.sigmoid(model(x))
        np.save(f"pred_{idx}.npy", preds.cpu().numpy())
    model.train()
'''

TRAIN = '''
import torch
import torch.nn as nn

from utils import get_loaders, save_checkpoint, save_predictions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def main():
    torch.manual_seed(0)
    model = nn.Linear(3, 1).to(DEVICE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.BCEWithLogitsLoss()
    train_loader, val_loader = get_loaders(4)
    for epoch in range(3):
        for x, y in train_loader:
            x, y = x.to(DEVICE), y.to(DEVICE)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        checkpoint = {"state_dict": model.state_dict(), "optimizer": optimizer.state_dict()}
        save_checkpoint(checkpoint)
        save_predictions(val_loader, model, device=DEVICE)
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
'''


def test_checkpoint_helper_of_another_module_saves_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SAVE_LOG.lstrip())
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    original = tmp_path / "original"
    original.mkdir()
    (original / "utils.py").write_text(textwrap.dedent(UTILS).lstrip())
    (original / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    result = subprocess.run([sys.executable, "-m", "migrate", "--output-dir", str(tmp_path / "migrated"), str(original)],
                            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    train = (tmp_path / "migrated" / "train.py").read_text()
    assert "        if accelerator.is_main_process:\n            save_checkpoint(checkpoint)\n" in train
    if not (tmp_path / "migrated" / "utils.py").exists():
        (tmp_path / "migrated" / "utils.py").write_text((original / "utils.py").read_text())
    one_orig, orig_dir = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    assert one.stdout == one_orig.stdout and "epoch 2 loss" in one.stdout
    assert len((one_dir / "saves.log").read_text().split()) == 3
    _, two_dir = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    pids = (two_dir / "saves.log").read_text().split()
    assert len(pids) == 3 and len(set(pids)) == 1  # once per epoch, by one process
