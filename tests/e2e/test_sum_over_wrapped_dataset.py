"""A training loss summed over each batch's samples and divided by `len(train_set)`, the dataset
the prepared loader wraps (PyG's examples write `loss_all / len(train_dataset)`), on 1 and 2
processes (AM011).

Each process sums its own share, so the sum must be reduced across processes before the division,
as for `len(loader.dataset)`. With split_batches (2 processes follow the 1-process trajectory) and
a dataset of whole rounds (no padding), the printed averages must equal the 1-process ones at every
epoch (unreduced: about half of them); on one process the migrated script prints what the original
prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(96, 5)
targets = features @ torch.randn(5, 1)
train_set = TensorDataset(features, targets)
loader = DataLoader(train_set, batch_size=8, shuffle=True)

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torch.nn.Linear(5, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)


def train_epoch():
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item() * x.size(0)
    return total / len(train_set)


for epoch in range(3):
    print(f"epoch {epoch} {train_epoch():.10f}")
'''


def _averages(stdout: str) -> list[float]:
    return [float(line.split()[2]) for line in stdout.splitlines() if line.startswith("epoch ")]


def test_sum_divided_by_the_wrapped_dataset_is_reduced(tmp_path: Path) -> None:
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert "total = accelerator.reduce(" in text, text

    runs = {}
    for name, script, launch in (
        ("original", original, [sys.executable]),
        ("one", migrated, [sys.executable]),
        ("two", migrated, [accel_executable(), "launch", "--nproc-per-node", "2"]),
    ):
        out = tmp_path / name
        out.mkdir()
        result = run_cmd(["env", "ACCEL_SPLIT_BATCHES=1", *launch, str(script)], cwd=out, timeout=TIMEOUT)
        assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        runs[name] = result.stdout
    assert runs["one"] == runs["original"], runs
    single, double = _averages(runs["original"]), _averages(runs["two"])
    assert len(single) == 3 and len(double) == 3, runs
    for a, b in zip(single, double):
        assert abs(a - b) <= 1e-5 * abs(a), (single, double)
