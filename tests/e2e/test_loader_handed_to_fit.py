"""A loader built by `main` (unpacked from a helper) and handed once to the function that builds
the optimizer (`nprocess_scripts/loader_handed_to_fit.py`), migrated with the CLI and run on 1 and
2 processes.

- The parameter is prepared in `fit` with the model and the optimizer, with no report (before:
  left unprepared, and reported with advice to hand it to `fit`, which it already was).
- The script never chose a device and scores a loader left whole on CPU batches in `main`, so the
  Accelerator is `Accelerator(cpu=True)`: it trains where the original did.
- The 1-process run of the migrated script gives exactly what the original gives.
- On 2 processes each rank draws its half of every epoch (4 of the 8 batches, 32 of the 60 rows
  with the padding of the last round), the weights agree on both ranks, and the held-out score
  covers all 20 rows on each rank.

Every run has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "loader_handed_to_fit.py"
TIMEOUT = 180

RUNS = RankFileScript(SCRIPT, TIMEOUT)


def test_the_parameter_is_prepared_on_the_cpu_without_a_report() -> None:
    work, report = RUNS.migrated
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "net, opt, fit_rows = accelerator.prepare(net, opt, fit_rows)" in migrated
    assert "accelerator = Accelerator(cpu=True)" in migrated
    assert "0 diagnostics" in report


def test_one_process_identical_to_original() -> None:
    assert RUNS.run("one") == RUNS.run("original")


def test_two_processes_share_each_epoch() -> None:
    (single,) = RUNS.run("one")
    assert len(single["seen"]) == 3 * 8 and sum(single["seen"]) == 3 * 60
    ranks = RUNS.run("two")
    assert len(ranks) == 2
    for rank in ranks:
        assert len(rank["seen"]) == 3 * 4 and sum(rank["seen"]) == 3 * 32
        assert rank["score"][1] == 20
    assert ranks[0]["weight"] == ranks[1]["weight"]
    assert ranks[0]["score"] == ranks[1]["score"]
