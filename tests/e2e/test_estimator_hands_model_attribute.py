"""A scikit-learn-style estimator whose `fit` builds the model as `self.model` and hands it to
functions of the module (`_fit(self.model, ...)` -> `_epoch(model, ...)`): the migration traces the
attribute into them (migrate/roles/model.py `_param_origins`), so the epoch loop is wrapped in
`accelerator.accumulate(model)`. Migrated with the CLI it prints the same lines on 1 process, and
on 2 gloo processes both ranks end with the same weights, each having run half of every epoch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _epoch(model, loader, optimizer):
    total, steps = 0.0, 0
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        steps += 1
    return total, steps


def _fit(model, loader, optimizer, epochs):
    for epoch in range(epochs):
        total, steps = _epoch(model, loader, optimizer)
        print(f"epoch {epoch} loss {total:.6f} steps {steps}")
    return model


class Regressor:
    def fit(self, X, y):
        loader = DataLoader(TensorDataset(X, y), batch_size=8, shuffle=True)
        self.model = nn.Linear(X.shape[1], 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        return _fit(self.model, loader, self.optimizer, 3)


if __name__ == "__main__":
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    model = Regressor().fit(X, X.sum(1, keepdim=True))
    weights = [round(v, 6) for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()]
    with open(f"weights_{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump(weights, f)
'''


def test_estimator_attribute_model_trains_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated_text = (folder / "migrated" / "train.py").read_text()
    assert "with accelerator.accumulate(model):" in migrated_text
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, migrated_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "epoch 2 loss" in original.stdout and "steps 8" in original.stdout
    assert (original_dir / "weights_0.json").read_text() == (migrated_dir / "weights_0.json").read_text()
    two, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert [line.split(" loss")[0] for line in two.stdout.splitlines()] == ["epoch 0", "epoch 1", "epoch 2"]
    assert all(line.endswith("steps 4") for line in two.stdout.splitlines())  # half of every epoch
    ranks = [json.loads((two_dir / f"weights_{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
