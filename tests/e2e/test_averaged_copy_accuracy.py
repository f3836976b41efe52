"""Metrics computed with a module the migration cannot tell is a model (a running average of the
weights, `nprocess_scripts/averaged_copy_accuracy.py`), whose outputs are compared with and
subtracted from the batch's labels: one value per sample, summed. Migrated with the CLI and run on
1 and 2 processes.

- The test loader is prepared and the batch is gathered before the metric lines (no AM010 report:
  before, the sums were taken for per-batch values and the report's advice was to sum over
  samples, which they already did).
- The 1-process run of the migrated script gives exactly what the original gives.
- On 2 processes, before training (the same weights everywhere), the accuracy, the summed error and
  the number of samples counted equal the 1-process ones on both ranks (37: the padding of the
  last round dropped). After training both ranks agree.

Every run has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "averaged_copy_accuracy.py"
TIMEOUT = 180

RUNS = RankFileScript(SCRIPT, TIMEOUT)


def test_the_batch_is_gathered_without_a_report() -> None:
    work, report = RUNS.migrated
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "inputs, labels = accelerator.gather_for_metrics((inputs, labels))" in migrated
    assert "model, optimizer, train_loader, test_loader = accelerator.prepare(" in migrated
    assert "AM010" not in report.replace("AM010 x1", "") and "0 diagnostics" in report


def test_one_process_identical_to_original() -> None:
    assert RUNS.run("one") == RUNS.run("original")


def test_metrics_on_two_processes_equal_one_process() -> None:
    (single,) = RUNS.run("one")
    ranks = RUNS.run("two")
    assert len(ranks) == 2
    for rank in ranks:
        accuracy, error, seen = rank["before"]
        assert seen == single["before"][2] == 37
        assert abs(accuracy - single["before"][0]) < 1e-9
        assert abs(error - single["before"][1]) < 1e-3
    assert ranks[0]["after"] == ranks[1]["after"]
