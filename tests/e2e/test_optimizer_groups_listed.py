"""An optimizer given a parameter group whose list is bound before (`trainable = [p for _, p in
net.named_parameters() if p.requires_grad]`, then `AdamW([{"params": trainable, "lr": ...}])`, the
shape of adapter and LLM fine-tuning scripts) prepares its model with it: migrated with the CLI, the
script prints the original's lines on 1 process; on 2 gloo processes each rank takes half of every
epoch's batches and both end with the same weights (before, the model was left unprepared and
each process trained its own copy)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Adapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(6, 16)
        self.head = nn.Linear(16, 3)
        for p in self.backbone.parameters():
            p.requires_grad = False

    def forward(self, x):
        return self.head(torch.relu(self.backbone(x)))


def main():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(48, 6), torch.randint(0, 3, (48,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    net = Adapter()
    trainable = [p for _, p in net.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": trainable, "lr": 0.05, "weight_decay": 0.01}], betas=(0.9, 0.95))
    steps = 0
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            steps += 1
        print(f"epoch {epoch} loss {loss.item():.6f}")
    head = torch.cat([p.detach().flatten() for p in net.parameters()])
    with open(f"rank{os.environ.get('RANK', '0')}.txt", "w") as f:
        f.write(f"{steps} " + " ".join(f"{v:.6f}" for v in head.tolist()))


if __name__ == "__main__":
    main()
'''


def test_listed_parameter_group_prepares_its_model(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    text = (folder / "migrated" / "train.py").read_text()
    assert "net, optimizer, loader = accelerator.prepare(net, optimizer, loader)" in text, text
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, migrated_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "epoch 2 loss" in original.stdout
    assert (original_dir / "rank0.txt").read_text() == (migrated_dir / "rank0.txt").read_text()
    _, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    rank0 = (two_dir / "rank0.txt").read_text().split()
    rank1 = (two_dir / "rank1.txt").read_text().split()
    assert rank0[0] == rank1[0] == "9"  # 3 epochs of 3 of the 6 batches
    assert rank0[1:] == rank1[1:]  # the same weights on both ranks: the model is synchronised
