"""An early stop on the step's own loss (`if value < tol: break`), in a script whose batches a
function of the script draws from torch's global RNG over a task drawn once, seeded alike
(`nprocess_scripts/step_loss_early_stop.py`: the advice of a hand-written update's report
followed). Migrated, the processes other than the main one are seeded apart after the prepare call
(AM004: each draws its own batches of the one task) and the step's loss is reduced across
processes before the test (AM011). One process runs exactly as the original; two processes finish
(within the timeout: a rank leaving alone would leave the other waiting in the next all-reduce),
leave the loop at the same step, see the same reduced losses, and end with the same weights,
while each draws batches of its own (the main process those of the original)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = RankFileScript(Path(__file__).resolve().parent / "nprocess_scripts" / "step_loss_early_stop.py", 180)


def test_the_step_loss_is_reduced_and_the_batches_seeded_apart() -> None:
    work, report = SCRIPT.migrated
    migrated = (work / "migrated" / "step_loss_early_stop.py").read_text()
    assert "if accelerator.process_index:\n    torch.manual_seed(torch.initial_seed() + accelerator.process_index)" in migrated
    assert 'value = accelerator.reduce(\n        torch.tensor(value, dtype=torch.float64, device=accelerator.device), "mean"' in migrated
    assert "warning" not in report  # migrated whole


def test_one_process_runs_as_the_original() -> None:
    (original,) = SCRIPT.run("original")
    (one,) = SCRIPT.run("one")
    assert one == original
    assert original["step"] < 2999  # the stop did trigger


def test_two_processes_stop_at_the_same_step() -> None:
    ranks = SCRIPT.run("two")
    assert len(ranks) == 2
    assert ranks[0]["step"] == ranks[1]["step"] < 2999
    assert ranks[0]["losses"] == ranks[1]["losses"]  # the reduced loss, the same on both
    assert ranks[0]["weight"] == ranks[1]["weight"]
    assert ranks[0]["first"] != ranks[1]["first"]  # each process draws its own batches
    (original,) = SCRIPT.run("original")
    assert ranks[0]["first"] == original["first"]  # the main process keeps the script's stream
