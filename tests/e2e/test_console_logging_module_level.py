"""A script with console `logging.basicConfig(...)` at module level and its training in functions
(the migration creates the Accelerator in `main()`): the file is migrated (AM012 runs the setup on
the launcher's rank 0, `RANK`) and trains. On 1 process the migrated copy ends with the original's
weights and logs as it does; on 2 processes it runs, the weights file is written once, and the
info lines are printed once (rank 1 keeps Python's logging defaults)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import json
import logging

import torch
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(format="%(levelname)s %(message)s", level=logging.INFO)


def fit(epochs, device):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(24, 3), torch.randn(24, 1)), batch_size=6)
    for epoch in range(epochs):
        logging.info("epoch %d done", epoch)
        for inputs, targets in data:
            inputs, targets = inputs.to(device), targets.to(device)
            err = torch.nn.functional.mse_loss(net(inputs), targets)
            opt.zero_grad()
            err.backward()
            opt.step()
    return net


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = fit(2, device)
    with open("weights.json", "w") as f:
        json.dump([p.detach().cpu().flatten().tolist() for p in net.parameters()], f)


if __name__ == "__main__":
    main()
'''


def test_module_level_console_logging_migrates_and_trains(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "accelerator.prepare(" in migrated and "accelerator.backward(err)" in migrated
    assert 'if int(environ.get("RANK", "0")) == 0:\n    logging.basicConfig(format="%(levelname)s %(message)s", level=logging.INFO)\n' in migrated, migrated

    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert json.loads((one_dir / "weights.json").read_text()) == json.loads((original_dir / "weights.json").read_text())
    assert one.stderr.count("INFO epoch 0 done") == original.stderr.count("INFO epoch 0 done") == 1

    two, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert len(json.loads((two_dir / "weights.json").read_text())) == 2
    assert (two.stdout + two.stderr).count("INFO epoch 1 done") == 1  # set up on rank 0 only
