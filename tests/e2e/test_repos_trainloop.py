"""The improved-diffusion repository shape (fixtures/repos/trainloop): scripts/image_train.py builds
the model and an infinite data generator and runs `TrainLoop(model=model, data=data, ...).run_loop()`
of tiny_diffusion/train_util.py, whose constructor builds the optimizer over a list of the model's
parameters and wraps the model in DDP (as `self.ddp_model`) when CUDA is there.

The class's constructor creates `self.accelerator` and prepares into the alias it trains through
(`self.ddp_model, self.opt = ...prepare(self.model, self.opt)`); the process-group helper is kept
and reported (its broadcast gets an `is_initialized()` guard); the script and the dataset that
takes its shard from `dist.get_rank()` are left as they are. One process trains bit-identically; two
processes print once, count the global batch of both, and end with the same weights (the
original, on CPU, trains each rank on its own and never synchronises).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e.test_repos import REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun

STEP = re.compile(r"^step (\d+) loss ([0-9.]+) samples (\d+)$", re.M)
SCRIPT = Path("scripts") / "image_train.py"

# Runs the script under torchrun, then saves each rank's trained parameters (test-side only: the
# script itself saves from the main process).
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


def test_trainloop_repository_migrates_as_one_unit_and_trains_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = REPOS / "trainloop"
    migrated, result = migrated_copy("trainloop", tmp_path, ["tiny_diffusion/dist_util.py", "tiny_diffusion/train_util.py"])
    output = result.stdout + result.stderr
    assert "AM007" in output and "`setup_dist`" in output  # the kept process-group helper is reported
    assert "AM004 warning" not in output  # the dataset's own shard (dist.get_rank()) is this process's
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run changes nothing

    plain = tmp_path / "original"
    shutil.copytree(case / "in", plain)
    monkeypatch.setenv("PYTHONPATH", str(plain))  # the package, as `pip install -e .` would give it
    original = run_cmd([sys.executable, str(SCRIPT)], cwd=plain, timeout=TIMEOUT)
    monkeypatch.setenv("PYTHONPATH", str(migrated))
    one = run_cmd([sys.executable, str(SCRIPT), "--save_dir", str(tmp_path)], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    steps = STEP.findall(original.stdout)
    assert [int(s) for s, _, _ in steps] == list(range(8))
    assert STEP.findall(one.stdout) == steps  # bit-identical at one process
    assert (tmp_path / "model000008.pt").exists() and (tmp_path / "ema_0.9_000008.pt").exists()
    saved = torch.load(tmp_path / "model000008.pt")
    assert all(not key.startswith("module.") for key in saved)  # the bare model is saved

    out = tmp_path / "two"
    out.mkdir()
    keep = tmp_path / "keep_weights.py"
    keep.write_text(KEEP_WEIGHTS)
    two = torchrun(keep, str(out), "--save_dir", str(out), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    lines = STEP.findall(two.stdout)
    # only the main process prints; the global batch counts both processes (4 samples each)
    assert [(int(s), int(n)) for s, _, n in lines] == [(s, (s + 1) * 8) for s in range(8)], two.stdout
    assert two.stdout.count("training...") == 1
    assert [loss for _, loss, _ in lines] != [loss for _, loss, _ in steps]  # each rank trains on its half
    first, second = (torch.load(out / f"rank{r}.pt") for r in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # gradients were synchronised
    saved = torch.load(out / "model000008.pt")
    assert all(torch.equal(saved[k], v) for k, v in zip(saved, first))  # the main process saved them
