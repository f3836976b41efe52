"""Batches drawn from torch's global generator, never seeded (`nprocess_scripts/
random_batches_unseeded.py`, the shape of pytorch/examples' distributed/ddp/example.py), migrated
with the CLI and run on 1 and 2 processes.

- The migration reports nothing: torch's CPU generator takes its seed from the operating system in
  each process, so each process draws batches of its own, as the original drew its own.
- On 1 process the migrated script trains (the loss falls), like the original.
- On 2 processes the two ranks start from different seeds and draw different batches at every
  step, while the model stays the same on both (the prepared model averages the gradients).

Every run has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "random_batches_unseeded.py"
TIMEOUT = 180

RUNS = RankFileScript(SCRIPT, TIMEOUT)


def test_migrated_without_a_report() -> None:
    work, report = RUNS.migrated
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "model, optimizer = accelerator.prepare(model, optimizer)" in migrated
    assert "AM004 warning" not in report and "0 diagnostics" in report and "1 migrated" in report, report


def test_one_process_trains_like_the_original() -> None:
    (original,) = RUNS.run("original")
    (one,) = RUNS.run("one")
    for run in (original, one):
        assert run["losses"][-1] < run["losses"][0] / 4, run["losses"]


def test_two_processes_draw_their_own_batches_and_agree_on_the_model() -> None:
    ranks = RUNS.run("two")
    assert [r["rank"] for r in ranks] == [0, 1]
    first, second = ranks
    assert first["initial_seed"] != second["initial_seed"]
    assert all(a != b for a, b in zip(first["batch_sums"], second["batch_sums"], strict=True))
    assert first["weight"] == second["weight"]
    assert first["losses"][-1] < first["losses"][0] / 4
