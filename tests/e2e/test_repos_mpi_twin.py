"""fixtures/repos/mpi_twin: fixtures/repos/mpi (processes started by mpiexec, refused whole: see
tests/migrate/test_mpi_launch.py) with its refusal's advice applied literally: the process group
from the launcher's environment (defaulted to a world of 1), the device index from LOCAL_RANK,
the checkpoint read by every process, the shard from `dist.get_rank()`, the logger's rank from
RANK. Migrated by the CLI to out/, it trains: bit-identical to its original at 1 process (plain
python), and at 2 gloo processes (torchrun) only the main process logs and prints, the global batch
counts both processes, and both ranks end with the same weights."""

from __future__ import annotations

import re
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.test_repos import REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun

STEP = re.compile(r"^step (\d+) loss ([0-9.]+) samples (\d+)$", re.M)
SCRIPT = Path("scripts") / "image_train.py"

# Runs the script, then saves each rank's trained parameters (test-side only).
KEEP_WEIGHTS = """
import runpy, sys
import torch
import torch.distributed as dist
from tiny_diffusion import train_util

out = sys.argv[1]
run_loop = train_util.TrainLoop.run_loop


def run_and_keep(self):
    run_loop(self)
    torch.save([p.detach() for p in self.model.parameters()], f"{out}/rank{dist.get_rank()}.pt")


train_util.TrainLoop.run_loop = run_and_keep
sys.argv = ["image_train.py", *sys.argv[2:]]
runpy.run_path("scripts/image_train.py", run_name="__main__")
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_mpi_twin_migrates_and_trains_at_one_and_two_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    migrated, result = migrated_copy("mpi_twin", tmp_path, ["tiny_diffusion/dist_util.py", "tiny_diffusion/train_util.py"])
    assert "[left unconverted]" not in result.stdout + result.stderr
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr

    plain = tmp_path / "original"
    shutil.copytree(REPOS / "mpi_twin" / "in", plain)
    monkeypatch.setenv("MASTER_PORT", _free_port())  # setup_dist's default port may be taken on a shared machine
    monkeypatch.setenv("PYTHONPATH", str(plain))
    original = run_cmd([sys.executable, str(SCRIPT)], cwd=plain, timeout=TIMEOUT)
    monkeypatch.setenv("PYTHONPATH", str(migrated))
    one = run_cmd([sys.executable, str(SCRIPT), "--save_dir", str(tmp_path)], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    steps = STEP.findall(original.stdout)
    assert [int(s) for s, _, _ in steps] == list(range(8))
    assert STEP.findall(one.stdout) == steps  # bit-identical at one process
    assert one.stdout.count("training...") == 1

    out = tmp_path / "two"
    out.mkdir()
    keep = tmp_path / "keep_weights.py"
    keep.write_text(KEEP_WEIGHTS)
    two = torchrun(keep, str(out), "--save_dir", str(out), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    lines = STEP.findall(two.stdout)
    assert [(int(s), int(n)) for s, _, n in lines] == [(s, (s + 1) * 8) for s in range(8)], two.stdout
    assert two.stdout.count("training...") == 1  # the logger's rank is torchrun's RANK
    assert [loss for _, loss, _ in lines] != [loss for _, loss, _ in steps]  # each rank trains on its half
    first, second = (torch.load(out / f"rank{r}.pt") for r in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # gradients were synchronised
    saved = torch.load(out / "model000008.pt")
    assert all(torch.equal(saved[k], v) for k, v in zip(saved, first))  # the main process saved them
