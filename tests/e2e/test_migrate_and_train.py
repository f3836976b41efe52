"""End to end: migrate the realistic scripts in fixtures/scripts with the CLI, then train.

(a) original and migrated scripts, each on one process, print identical loss sequences;
(b) the migrated script under `accel launch --nproc-per-node 2` (gloo, CPU) exits 0, each rank
    runs half of every epoch's batches (the main process prints its half once), and the loss
    decreases.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "scripts").glob("*.py"))
LOSS = re.compile(r"epoch (\d+) step (\d+) loss ([0-9.]+)")
TIMEOUT = 240  # seconds; a hang fails the test instead of stalling CI


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", NO_COLOR="1")
    env.pop("PYTHONPATH", None)
    return env


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)


def _losses(output: str) -> list[tuple[int, int, str]]:
    return [(int(e), int(s), loss) for e, s, loss in LOSS.findall(output)]


def _accel() -> str:
    found = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert found, "the `accel` console script is not installed"
    return found


@pytest.fixture(params=SCRIPTS, ids=lambda p: p.stem)
def migrated(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    original = request.param
    target = tmp_path / original.name
    shutil.copy(original, target)
    result = _run([sys.executable, "-m", "migrate", str(target)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = target.read_text()
    assert "accelerator.prepare(" in text and "accelerator.backward(" in text
    assert ".to(device)" not in text
    return original, target


def test_one_process_losses_identical(migrated: tuple[Path, Path]) -> None:
    original, target = migrated
    before = _run([sys.executable, str(original)], cwd=target.parent)
    after = _run([sys.executable, str(target)], cwd=target.parent)
    assert before.returncode == 0, before.stderr
    assert after.returncode == 0, after.stderr
    assert _losses(before.stdout), "the original printed no losses"
    assert _losses(after.stdout) == _losses(before.stdout)


def test_two_processes_train(migrated: tuple[Path, Path]) -> None:
    original, target = migrated
    single = _losses(_run([sys.executable, str(original)], cwd=target.parent).stdout)
    steps_per_epoch = max(step for _, step, _ in single) + 1

    result = _run([_accel(), "launch", "--nproc-per-node", "2", str(target)], cwd=target.parent)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    losses = _losses(result.stdout)

    per_epoch: dict[int, list[float]] = defaultdict(list)
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for epoch, step, loss in losses:
        per_epoch[epoch].append(float(loss))
        counts[(epoch, step)] += 1
    # Each rank runs half of the batches, and only the main process prints (accelerator.print):
    # steps 0..n/2-1 of every epoch, once each.
    half = (steps_per_epoch + 1) // 2
    assert sorted(per_epoch) == sorted({e for e, _, _ in single})
    assert counts == {(e, s): 1 for e in per_epoch for s in range(half)}
    epochs = sorted(per_epoch)
    first = sum(per_epoch[epochs[0]]) / len(per_epoch[epochs[0]])
    last = sum(per_epoch[epochs[-1]]) / len(per_epoch[epochs[-1]])
    assert last < first
