"""The two-module solver shape (fixtures/repos/solverprint): main.py prints its options under
`if __name__ == "__main__":` and hands them to solver.py's `Solver`, whose constructor chooses the
device (and so creates the Accelerator). The print, where no Accelerator exists yet, runs on the
launcher's rank 0: once at one process (as the original) and once at two, where both ranks train
their halves and end with the same weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.e2e.test_repos import TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun


def test_options_printed_before_the_solver_creates_the_accelerator_print_once(tmp_path: Path) -> None:
    migrated, _ = migrated_copy("solverprint", tmp_path, ["main.py", "solver.py"])
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run changes nothing

    original_dir, one_dir, two_dir = tmp_path / "o", tmp_path / "one", tmp_path / "two"
    for folder in (original_dir, one_dir, two_dir):
        folder.mkdir()
    original = run_cmd([sys.executable, str(Path(__file__).resolve().parents[2] / "fixtures" / "repos" / "solverprint"
                                            / "in" / "main.py"), "--out", "."],
                       cwd=original_dir, timeout=TIMEOUT)
    one = run_cmd([sys.executable, str(migrated / "main.py"), "--out", "."], cwd=one_dir, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    assert original.stdout == one.stdout
    assert original.stdout.count("Namespace(") == 1 and "steps 6 loss" in original.stdout

    two = torchrun(migrated / "main.py", "--out", ".", cwd=two_dir, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    assert two.stdout.count("Namespace(") == 1, two.stdout
    assert two.stdout.count("steps 6 loss") == 1, two.stdout
    weights = [json.loads((two_dir / f"rank{r}.json").read_text()) for r in range(2)]
    assert weights[0] == weights[1]
