"""The folder-helper shape (fixtures/repos/folderhelper, found in a DeepLabV3+ repository's
`utils.mkdir('checkpoints')`): the script makes its checkpoint folder with a helper of its own
package that the migration does not read (`import utils`; utils/__init__.py `from .utils import *`;
utils/utils.py `if not os.path.exists(path): os.mkdir(path)`). Every process would call it, and
N processes may all find the folder missing: all but the first then fail with FileExistsError
(seen at 2 processes on the repository). The call runs on the main process, then every process
waits for it: one process trains as the original (identical losses, the same checkpoints); two
make the folder once, train their halves and both checkpoints are written with the user's keys.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

from tests.e2e.test_repos import LOSS, REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun

VAL = re.compile(r"^itrs (\d+) val acc ([0-9.]+)$", re.M)


def test_folder_made_by_an_unread_helper_runs_once_before_the_others_write(tmp_path: Path) -> None:
    case = REPOS / "folderhelper"
    migrated, result = migrated_copy("folderhelper", tmp_path, ["main.py"])
    main = (migrated / "main.py").read_text()
    assert ("    if accelerator.is_main_process:\n        utils.mkdir(args.ckpt_dir)\n"
            "    accelerator.wait_for_everyone()\n") in main
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run changes nothing

    original_dir, one_dir = tmp_path / "ckpt-original", tmp_path / "ckpt-one"
    original = run_cmd([sys.executable, "main.py", "--ckpt-dir", str(original_dir)], cwd=case / "in", timeout=TIMEOUT)
    one = run_cmd([sys.executable, "main.py", "--ckpt-dir", str(one_dir)], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    losses = LOSS.findall(original.stdout)
    assert len(losses) == 12  # the iteration budget
    assert LOSS.findall(one.stdout) == losses and VAL.findall(one.stdout) == VAL.findall(original.stdout)
    for name in ("latest.pth", "best.pth"):
        a, b = torch.load(original_dir / name), torch.load(one_dir / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    two_dir = tmp_path / "ckpt-two"
    for attempt in range(3):  # the race is timing-dependent: run it more than once
        two = torchrun(migrated / "main.py", "--ckpt-dir", str(two_dir), cwd=migrated, timeout=TIMEOUT)
        assert two.returncode == 0, two.stdout + two.stderr
        steps = LOSS.findall(two.stdout)
        assert len(steps) == 12 and {s for _, s, _ in steps} == {"0", "1", "2"}  # half an epoch each, printed once
        state = torch.load(two_dir / "latest.pth")
        assert (two_dir / "best.pth").exists() and not any(k.startswith("module.") for k in state)
        if attempt < 2:
            for path in two_dir.iterdir():
                path.unlink()
            two_dir.rmdir()
