"""A loader handed once to the function that builds the optimizers and passed on to the function
whose loop trains (`nprocess_scripts/loader_passed_to_epoch_function.py`, the shape of the seq2seq
translation tutorial's `train` / `train_epoch`), migrated with the CLI and run on 1 and 2 processes.

- It is prepared in `fit` with both models and both optimizers, with no report (before: left
  unprepared, reported as "a parameter nobody in this run passes").
- The 1-process run of the migrated script gives exactly what the original gives.
- On 2 processes each rank draws 5 of the 10 batches of every pass, and both ranks end with the
  same weights.

Every run has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "loader_passed_to_epoch_function.py"
TIMEOUT = 180

RUNS = RankFileScript(SCRIPT, TIMEOUT)


def test_the_loader_is_prepared_where_the_optimizers_are_built() -> None:
    work, report = RUNS.migrated
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "enc, dec, enc_opt, dec_opt, stream = accelerator.prepare(" in migrated
    assert "0 diagnostics" in report


def test_one_process_identical_to_original() -> None:
    assert RUNS.run("one") == RUNS.run("original")


def test_two_processes_share_each_pass() -> None:
    (single,) = RUNS.run("one")
    assert len(single["seen"]) == 2 * 10
    ranks = RUNS.run("two")
    assert len(ranks) == 2
    for rank in ranks:
        assert len(rank["seen"]) == 2 * 5 and sum(rank["seen"]) == 2 * 20
    assert ranks[0]["head"] == ranks[1]["head"]
