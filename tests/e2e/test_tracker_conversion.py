"""A SummaryWriter script converted to the tracker API (AM012) logs what the original logged.

fixtures/pipeline/tensorboard_scalars writes `train/loss` every step and `train/lr` every epoch
through `SummaryWriter("runs/mlp")`; its golden output uses `Accelerator(log_with="tensorboard",
project_dir="runs")`, `init_trackers("mlp")` and `accelerator.log`. The original runs on one
process; the migrated file on one process and on 2 (gloo, torch.distributed.run). The event files
in each run's `runs/mlp` are read back with tensorboard's EventAccumulator:
- one process: the same tags, steps and values, bit for bit (the same directory, too);
- 2 processes: exactly one event file (rank 0's), the same learning rates at the same epochs, and
  one loss per step of rank 0 (each rank runs half of the batches, so 12 steps instead of 24);
- migrated with `--target accelerate` and run under HF Accelerate (one process): the same event
  file as the original's too (skipped when accelerate is not installed; the test extra has it).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd, torchrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "fixtures" / "pipeline" / "tensorboard_scalars"
TIMEOUT = 180
BATCHES, EPOCHS = 8, 3  # 64 samples, batch 8


def _events(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = run_dir / "runs" / "mlp"
    files = list(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, files  # one writer: on 2 processes, rank 0's only
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _run(script: Path, folder: Path, nproc: int) -> dict[str, list[tuple[int, float]]]:
    folder.mkdir()
    shutil.copy(script, folder / "train.py")
    if nproc == 1:
        result = run_cmd([sys.executable, "train.py"], cwd=folder, timeout=TIMEOUT)
    else:
        result = torchrun(folder / "train.py", cwd=folder, nproc=nproc, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return _events(folder)


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, float]]]:
    """The original script's event file (run once for both tests)."""
    return _run(CASE.with_name(CASE.name + ".in.py"), tmp_path_factory.mktemp("tracker") / "original", 1)


def test_converted_writer_logs_like_the_original(original, tmp_path: Path) -> None:
    migrated = CASE.with_name(CASE.name + ".out.py")
    assert 'log_with="tensorboard"' in migrated.read_text()
    assert sorted(original) == ["train/loss", "train/lr"]
    assert [step for step, _ in original["train/loss"]] == list(range(BATCHES * EPOCHS))
    assert original["train/lr"] == [(0, pytest.approx(0.05)), (1, pytest.approx(0.025)), (2, pytest.approx(0.0125))]

    assert _run(migrated, tmp_path / "one", 1) == original

    two = _run(migrated, tmp_path / "two", 2)
    assert sorted(two) == ["train/loss", "train/lr"]
    assert two["train/lr"] == original["train/lr"]
    assert [step for step, _ in two["train/loss"]] == list(range(BATCHES // 2 * EPOCHS))
    assert all(value > 0 for _, value in two["train/loss"])


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="HF accelerate is not installed")
def test_converted_writer_logs_the_same_under_hf_accelerate(original, tmp_path: Path) -> None:
    source = CASE.with_name(CASE.name + ".in.py")
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--target", "accelerate", "--output-dir", str(tmp_path / "migrated"),
         str(source)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    migrated = tmp_path / "migrated" / source.name
    assert "from accelerate import Accelerator" in migrated.read_text()
    assert _run(migrated, tmp_path / "accelerate", 1) == original
