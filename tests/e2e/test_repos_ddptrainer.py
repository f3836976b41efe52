"""The note on a trainer module that already trains distributed (fixtures/replace_loss_backward/
leave_trainer_already_distributed), followed literally (fixtures/repos/ddptrainer): the training
DataLoader, without its DistributedSampler, is built by the script and handed to the trainer, and
both files are migrated in one run. The migrated repository trains like the original: at one
process the losses are those of the original under torchrun at one process; at two processes each
rank trains on half of every epoch, only the main process prints, and the saved weights have the
user's keys."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.e2e.test_repos import LOSS, REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun


def test_trainer_with_the_loader_handed_in_migrates_with_its_script_and_trains_the_same(tmp_path: Path) -> None:
    case = REPOS / "ddptrainer"
    migrated, result = migrated_copy("ddptrainer", tmp_path, ["main.py", "trainer.py"])
    assert "warning" not in result.stdout + result.stderr  # migrated whole, nothing reported
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr

    original = torchrun(case / "in" / "main.py", cwd=case / "in", nproc=1, timeout=TIMEOUT)
    one = run_cmd([sys.executable, "main.py"], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    losses = LOSS.findall(original.stdout)
    assert len(losses) == 12  # 2 epochs x 6 batches
    assert LOSS.findall(one.stdout) == losses

    weights = tmp_path / "w.pt"
    two = torchrun(migrated / "main.py", "--output", str(weights), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    steps = [(int(e), int(s)) for e, s, _ in LOSS.findall(two.stdout)]
    assert steps == [(e, s) for e in range(2) for s in range(3)], two.stdout  # half an epoch, printed once
    state = torch.load(weights, map_location="cpu")
    assert sorted(state) == ["bias", "weight"]
