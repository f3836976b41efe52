"""An `mp.spawn` launcher migrated with the CLI and run under `accel launch --nproc-per-node 2`.

`spawn_scripts/spawn_ddp.py` trains a DDP model on CPU with gloo, its 2 processes started by
`mp.spawn` and its data split by a DistributedSampler. AM007 calls the worker directly (rank from
`LOCAL_RANK`, process count from `LOCAL_WORLD_SIZE`: the processes of one node, as spawn's
`nprocs`) and replaces the process group, the sampler and DDP by
the Accelerator. Launched with `accel launch --nproc-per-node 2`, both ranks must run and see 2
processes, each must train on its own half of every epoch, the final weights must be equal on both
ranks and equal to the original's, and every step's loss averaged over the ranks (the loss of the
step's 16 samples) must equal the original's. Every run has a timeout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd, run_original  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "spawn_scripts" / "spawn_ddp.py"
TIMEOUT = 180


@lru_cache(maxsize=None)
def _workdir() -> Path:
    work = Path(tempfile.mkdtemp(prefix="spawn-conversion-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPT)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return work


def _migrated() -> Path:
    return _workdir() / "migrated" / SCRIPT.name


@lru_cache(maxsize=None)
def _run(how: str) -> tuple[dict, ...]:
    out = _workdir() / how
    out.mkdir()
    if how == "original":
        cmd = [sys.executable, str(SCRIPT), str(out)]
    else:
        accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
        assert accel, "the `accel` console script is not installed"
        cmd = [accel, "launch", "--nproc-per-node", "2", str(_migrated()), str(out)]
    result = (run_original if how == "original" else run_cmd)(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return tuple(json.loads(p.read_text()) for p in sorted(out.glob("rank*.json")))


def test_the_spawn_launcher_is_converted() -> None:
    text = _migrated().read_text()
    assert "mp.spawn(" not in text and "init_process_group" not in text and "MASTER_PORT" not in text
    assert 'worker(int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1")), sys.argv[1])' in text
    assert "accelerator = Accelerator()" in text


@pytest.fixture(scope="module")
def runs() -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    return _run("original"), _run("launched")


def test_both_ranks_run_on_two_processes(runs: tuple[tuple[dict, ...], tuple[dict, ...]]) -> None:
    original, launched = runs
    assert [r["rank"] for r in original] == [0, 1]
    assert [(r["rank"], r["world_size"]) for r in launched] == [(0, 2), (1, 2)]


def test_each_rank_sees_its_half_of_every_epoch(runs: tuple[tuple[dict, ...], tuple[dict, ...]]) -> None:
    _, launched = runs
    first, second = (r["seen"] for r in launched)
    assert len(first) == len(second) == 3 * 32
    for epoch in range(3):
        halves = first[epoch * 32:(epoch + 1) * 32], second[epoch * 32:(epoch + 1) * 32]
        assert not set(halves[0]) & set(halves[1])
        assert sorted(halves[0] + halves[1]) == list(range(64))


def test_weights_and_losses_match_the_spawn_run(runs: tuple[tuple[dict, ...], tuple[dict, ...]]) -> None:
    original, launched = runs
    assert launched[0]["weights"] == launched[1]["weights"]
    assert launched[0]["weights"] == pytest.approx(original[0]["weights"], abs=1e-6)

    def step_losses(ranks: tuple[dict, ...]) -> list[float]:
        return [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]

    expected = step_losses(original)
    assert len(expected) == 3 * 4
    assert step_losses(launched) == pytest.approx(expected, abs=1e-6)
