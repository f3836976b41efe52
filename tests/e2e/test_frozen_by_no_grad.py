"""A script whose pretrained encoder runs under `torch.no_grad()` (its parameters never frozen)
and whose embedding is detached by a `fix_emb` flag trains on 1 process; migrated with the CLI it
prints the same lines on 1 process and trains on 2 gloo processes, where plain DDP stops at the
second step (runtime/unused_parameters.py leaves those parameters out of the synchronisation)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, fix_emb=True):
        super().__init__()
        self.fix_emb = fix_emb
        self.embed = nn.Embedding(20, 6)
        self.encoder = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        e = self.embed(tokens).mean(1)
        if self.fix_emb:
            e = e.detach()
        with torch.no_grad():
            features = self.encoder(e)
        return self.head(features)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokens = torch.randint(0, 20, (48, 5))
    labels = torch.randint(0, 3, (48,))
    loader = DataLoader(TensorDataset(tokens, labels), batch_size=6, shuffle=True)
    model = Classifier().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(3):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch} loss {total:.6f}")
    print(f"head {model.head.weight.sum().item():.6f}")


if __name__ == "__main__":
    main()
'''


def test_frozen_by_no_grad_trains_migrated_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, _ = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "epoch 2 loss" in original.stdout
    two, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    lines = two.stdout.splitlines()
    assert [line.split(" loss")[0] for line in lines if " loss " in line] == ["epoch 0", "epoch 1", "epoch 2"]
    # (the runtime's warning naming the left-out parameters is tested in
    # tests/runtime/test_unused_parameters.py; these runs ignore warnings)
