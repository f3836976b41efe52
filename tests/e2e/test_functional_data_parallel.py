"""The functional `nn.parallel.data_parallel` in a model's `forward` becomes the direct call of the
module (AM007), and the migrated script trains like the original at 1 and 2 gloo processes.

`distributed_shape_scripts/functional_data_parallel.py` calls `data_parallel(self.layers, x,
range(self.gpus))` when its input is on CUDA and it is given several GPUs, else `self.layers(x)`:
on a CPU the original takes the direct path, which is the whole migrated `forward`. On one process
the migrated copy gives the original's losses and weights; on two, with `ACCEL_SPLIT_BATCHES=1`
(each rank half of every batch of 8), the mean of the ranks' losses is the original's loss at each
step and both ranks end with the original's weights. Every run has a timeout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "distributed_shape_scripts" / "functional_data_parallel.py"
TIMEOUT = 180


@pytest.fixture(scope="module")
def migrated() -> Path:
    work = Path(tempfile.mkdtemp(prefix="functional-dp-"))
    result = subprocess.run([sys.executable, "-m", "migrate", "--output-dir", str(work), str(SCRIPT)],
                            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    return work / SCRIPT.name


def _run(script: Path, nproc: int, launch: bool) -> list[dict]:
    out = Path(tempfile.mkdtemp(prefix=f"functional-dp-{nproc}-"))
    if launch:
        accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
        assert accel, "the `accel` console script is not installed"
        cmd = [accel, "launch", "--nproc-per-node", str(nproc), str(script), str(out)]
    else:
        cmd = [sys.executable, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{script.name} x{nproc} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_forward_calls_the_module_directly(migrated: Path) -> None:
    text = migrated.read_text()
    assert "data_parallel(" not in text and "self.gpus > 1" not in text
    forward = text[text.index("def forward("):text.index("def main(")]
    assert "out = self.layers(x)" in forward and "if " not in forward


def test_one_process_trains_like_the_original(migrated: Path) -> None:
    (original,) = _run(SCRIPT, 1, launch=False)
    (alone,) = _run(migrated, 1, launch=False)
    assert len(original["losses"]) == 3 * 8
    assert alone["losses"] == pytest.approx(original["losses"], abs=1e-6)
    assert alone["weights"] == pytest.approx(original["weights"], abs=1e-6)


def test_two_processes_split_each_batch(migrated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (original,) = _run(SCRIPT, 1, launch=False)
    monkeypatch.setenv("ACCEL_SPLIT_BATCHES", "1")
    ranks = _run(migrated, 2, launch=True)
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    assert mean == pytest.approx(original["losses"], rel=1e-5, abs=1e-6)
    for rank in ranks:
        assert rank["weights"] == pytest.approx(original["weights"], abs=1e-5)
