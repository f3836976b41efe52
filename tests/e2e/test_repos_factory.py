"""The optimizer-factory shape (fixtures/repos/factory): the training loop is in main.py and only the
optimizer comes from optim_factory.py's `create_optimizer(args, model)` over weight-decay parameter
groups. The unit migrates main.py alone (the factory needs no edit and is left as it is); the
migrated script trains like the original at one process (identical losses) and at two (each rank
half of every epoch, only the main process prints, both ranks end with the same weights, saved once).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.e2e.test_repos import LOSS, REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun


def test_optimizer_factory_repository_migrates_the_script_and_trains_the_same(tmp_path: Path) -> None:
    case = REPOS / "factory"
    migrated, result = migrated_copy("factory", tmp_path, ["main.py"])
    main = (migrated / "main.py").read_text()
    assert "optimizer = create_optimizer(args, model)\n    model, optimizer, loader = accelerator.prepare(" in main
    assert "AM013" not in result.stdout + result.stderr
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run changes nothing

    original = run_cmd([sys.executable, "main.py"], cwd=case / "in", timeout=TIMEOUT)
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
    assert not any(k.startswith("module.") for k in state)  # the user's module, unwrapped
