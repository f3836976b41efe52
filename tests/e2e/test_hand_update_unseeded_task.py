"""A training step that updates a module's parameters by hand, with no optimizer, on batches a
function draws from torch's global generator, made from a task drawn with no seed at the module
level (`nprocess_scripts/hand_update_unseeded_task.py`, the shape of pytorch/examples' regression),
migrated with the CLI and run on 1 and 2 processes.

- The migration prepares the module alone and keeps the hand update; it reports nothing.
- On 1 process, seeded from outside the same way, the migrated script draws, trains and stops
  exactly as the original.
- On 2 processes both ranks fit the same task (the runtime's Accelerator gives every process rank
  0's RNG state when it is created, runtime/rng.py), each draws its own batches (seeded apart at the
  first prepare call), the hand update reads averaged gradients so the weights stay identical, the
  reduced loss stops both at the same step, and the loss falls.

A function-style script with a DataLoader whose helper updates the parameters it is handed
(`descend(model.parameters(), lr)`, `p -= lr * p.grad` under `torch.no_grad()`) is identical to its
original on 1 process and ends with equal weights on 2, each rank on its half of the batches.

Every run has a timeout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript, migrate_into, run_copy  # noqa: E402
from rt_helpers import run_cmd  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "hand_update_unseeded_task.py"
TIMEOUT = 240

RUNS = RankFileScript(SCRIPT, TIMEOUT)


def test_migrated_with_the_module_prepared_alone() -> None:
    work, report = RUNS.migrated
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "net = accelerator.prepare(net)" in migrated
    assert "accelerator.backward(objective)" in migrated
    assert "weight.data.add_(-0.3 * weight.grad)" in migrated  # the hand update is kept
    assert "accelerate(" not in migrated and "manual_seed" not in migrated
    assert "0 diagnostics" in report and "1 migrated" in report, report


def _seeded_run(script: Path, out: Path) -> dict:
    """`script` run on 1 process after `torch.manual_seed(5)`, so the original and the migrated
    copy draw the same task and batches."""
    out.mkdir()
    code = ("import runpy, sys, torch; torch.manual_seed(5); "
            f"sys.argv = [{str(script)!r}, {str(out)!r}]; runpy.run_path(sys.argv[0], run_name='__main__')")
    result = run_cmd([sys.executable, "-c", code], cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "rank0.json").read_text())


def test_one_process_trains_as_the_original() -> None:
    work, _ = RUNS.migrated
    original = _seeded_run(SCRIPT, work / "seeded-original")
    migrated = _seeded_run(work / "migrated" / SCRIPT.name, work / "seeded-migrated")
    assert migrated == original
    assert original["losses"][-1] < original["losses"][0] / 100


def test_two_processes_fit_one_task_with_their_own_batches_and_equal_weights() -> None:
    first, second = RUNS.run("two")
    assert [first["rank"], second["rank"]] == [0, 1]
    assert first["task"] == second["task"]
    assert all(a != b for a, b in zip(first["batch_sums"], second["batch_sums"], strict=True))
    assert first["weight"] == second["weight"]
    assert first["steps"] == second["steps"] and first["losses"] == second["losses"]
    assert first["losses"][-1] < first["losses"][0] / 100, first["losses"][::50]
    fitted = [abs(w - t) for w, t in zip(first["weight"], first["task"], strict=True)]
    assert max(fitted) < 0.2, (first["weight"], first["task"])


# A function-style script with a DataLoader, the update by hand in a helper handed the model's
# parameters, under `torch.no_grad()` (`p -= lr * p.grad`), seeded: the model and the loader are
# prepared together, and the helper is kept.
LOADER_SCRIPT = '''
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def descend(params, lr):
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


def main():
    torch.manual_seed(0)
    x = torch.randn(96, 3)
    y = (x[:, :1] * 2 - x[:, 1:2] + 0.5 * x[:, 2:]).tanh()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
    losses = []
    for epoch in range(6):
        for inputs, targets in loader:
            model.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            descend(model.parameters(), 0.1)
            losses.append(loss.item())
        print(f"epoch {epoch} loss {loss.item():.6f}")
    rank = int(os.environ.get("RANK", "0"))
    with open(f"rank{rank}.json", "w") as f:
        json.dump({"losses": losses, "weights": [p.detach().view(-1).tolist() for p in model.parameters()]}, f)


if __name__ == "__main__":
    main()
'''


def test_loader_and_helper_update_at_one_and_two_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", LOADER_SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "model, loader = accelerator.prepare(model, loader)" in migrated
    assert "p -= lr * p.grad" in migrated and "accumulate(" not in migrated
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert one.stdout == original.stdout
    assert json.loads((one_dir / "rank0.json").read_text()) == json.loads((original_dir / "rank0.json").read_text())
    two, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    first, second = (json.loads((two_dir / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["weights"] == second["weights"]
    assert len(first["losses"]) == len(second["losses"]) == 6 * 6  # half of the 12 batches per epoch each
    assert first["losses"] != second["losses"]  # each rank its own batches
    assert sum(first["losses"][-6:]) < sum(first["losses"][:6]) / 2
    assert two.stdout.count("epoch 5 loss") == 1  # printed by the main process only
