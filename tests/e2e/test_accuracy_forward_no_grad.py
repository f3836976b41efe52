"""An accuracy over a loader whose loop turns autograd off only around the forward, in a function
that rebinds `model = model.eval()` (`nprocess_scripts/accuracy_forward_no_grad.py`, the shape of
rasbt's appendix-A notebook), migrated with the CLI and run on 1 and 2 processes.

- The per-sample matches are gathered (`matches = accelerator.gather_for_metrics(matches)`), for the
  training loader and the test loader alike, with no report left.
- The 1-process run of the migrated script gives exactly what the original gives.
- On 2 processes, before training (the same weights everywhere), the accuracy over each loader and
  the number of samples counted equal the 1-process ones on both ranks: 37 each, the padding of
  the last round dropped. After training both ranks agree.

Every run has a timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import RankFileScript  # noqa: E402

SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "accuracy_forward_no_grad.py"
TIMEOUT = 180


RUNS = RankFileScript(SCRIPT, TIMEOUT)


def _migrated() -> tuple[Path, str]:
    return RUNS.migrated


def _run(how: str) -> list[dict]:
    return RUNS.run(how)


def test_the_matches_are_gathered_without_a_report() -> None:
    work, report = _migrated()
    migrated = (work / "migrated" / SCRIPT.name).read_text()
    assert "matches = accelerator.gather_for_metrics(matches)" in migrated
    assert "train_loader, test_loader = accelerator.prepare(" in migrated
    assert "AM010 warning" not in report and "0 diagnostics" in report


def test_one_process_identical_to_original() -> None:
    assert _run("one") == _run("original")


def test_accuracy_on_two_processes_equals_one_process() -> None:
    (single,) = _run("one")
    ranks = _run("two")
    assert len(ranks) == 2
    for rank in ranks:
        for got, want in zip(rank["before"], single["before"], strict=True):
            assert got[1] == want[1] == 37  # every sample counted once
            assert abs(got[0] - want[0]) < 1e-6, (got, want)
    assert ranks[0]["after"] == ranks[1]["after"]
