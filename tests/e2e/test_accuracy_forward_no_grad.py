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

import json
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "nprocess_scripts" / "accuracy_forward_no_grad.py"
TIMEOUT = 180


def _accel() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


@lru_cache(maxsize=None)
def _migrated() -> tuple[Path, str]:
    work = Path(tempfile.mkdtemp(prefix="accuracy-no-grad-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPT)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work, result.stdout + result.stderr


@lru_cache(maxsize=None)
def _run(how: str) -> list[dict]:
    work, _ = _migrated()
    out = work / how
    out.mkdir()
    script = SCRIPT if how == "original" else work / "migrated" / SCRIPT.name
    if how in ("original", "one"):
        cmd = [sys.executable, str(script), str(out)]
    else:
        cmd = [_accel(), "launch", "--nproc-per-node", "2", str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


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
