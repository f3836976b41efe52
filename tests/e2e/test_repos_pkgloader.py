"""The swin-shaped repository fixtures/repos/pkgloader: main.py imports its loader builder from the
`data` package (data/__init__.py wraps `build_loader` of data/build.py in a dispatcher whose
default branch hands the call on, see migrate/forwarding.py; data/build.py builds the training loader over a DistributedSampler from `dist.get_rank()`), its optimizer from a factory
whose parameter groups come from a helper (`set_weight_decay(model, ...)`), and sets up the
process group in `if __name__ == "__main__":`. Migrated as one unit: the loader is prepared in
main.py and its sampler removed inside data/build.py (sharded once), the optimizer and the model
are prepared at the factory's binding, `reduce_tensor` of utils.py takes the accelerator as a
keyword (its world size) and runs its all_reduce only where a process group exists; main.py keeps
`from data import build_loader` (the builder needs no accelerator once its sampler is gone)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.e2e.test_repos import LOSS, REPOS, TIMEOUT, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun

VAL = re.compile(r"^epoch (\d+) val acc ([0-9.]+) loss ([0-9.]+) of 24 samples$", re.M)


def test_pkgloader_repository_migrates_as_one_unit_and_trains_the_same(tmp_path: Path) -> None:
    case = REPOS / "pkgloader"
    migrated, result = migrated_copy("pkgloader", tmp_path, ["data/build.py", "main.py", "utils.py"])
    main = (migrated / "main.py").read_text()
    assert "accelerator.prepare(\n        model, optimizer, data_loader_train\n    )" in main
    assert "init_process_group" not in main and "DistributedDataParallel" not in main
    # the builder's rank reads went with its sampler: it takes no accelerator, so main.py keeps the
    # package's import (its wrapper dispatches `build_loader(config)` as before)
    assert "from data import build_loader\n" in main and "= build_loader(config)\n" in main
    build = (migrated / "data" / "build.py").read_text()
    assert "DistributedSampler" not in build and "def build_loader(config):" in build  # sharded once, by prepare
    utils = (migrated / "utils.py").read_text()
    assert "def reduce_tensor(tensor, *, accelerator):" in utils and "rt /= accelerator.num_processes" in utils
    assert "reduce_tensor(total_loss / len(data_loader), accelerator=accelerator)" in main

    # the original needs a launcher (its process group is set up unconditionally)
    original = torchrun(case / "in" / "main.py", "--output", str(tmp_path / "o0"), cwd=case / "in", nproc=1,
                        timeout=TIMEOUT)
    one = run_cmd([sys.executable, "main.py", "--output", str(tmp_path / "o1")], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    losses = LOSS.findall(original.stdout)
    assert len(losses) == 12  # 2 epochs x 6 batches
    assert LOSS.findall(one.stdout) == losses  # bit-identical at one process, without a launcher
    assert VAL.findall(one.stdout) == VAL.findall(original.stdout) and len(VAL.findall(one.stdout)) == 2
    assert sorted(p.name for p in (tmp_path / "o1").iterdir()) == ["ckpt_epoch_0.pth", "ckpt_epoch_1.pth"]

    two = torchrun(migrated / "main.py", "--output", str(tmp_path / "o2"), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    # each rank trains on half of every epoch (the sampler is not kept beside prepare's sharding:
    # 1/4 each would give 1 or 2 steps); only the main process prints
    steps = [(int(e), int(s)) for e, s, _ in LOSS.findall(two.stdout)]
    assert steps == [(e, s) for e in range(2) for s in range(3)], two.stdout
    assert len(VAL.findall(two.stdout)) == 2
    assert sorted(p.name for p in (tmp_path / "o2").iterdir()) == ["ckpt_epoch_0.pth", "ckpt_epoch_1.pth"]
