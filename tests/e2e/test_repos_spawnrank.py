"""fixtures/repos/spawnrank: an `mp.spawn` launcher whose spawning function computes the rank, the
world size and the rendezvous address into `args` (SLURM or one node), migrated and trained.

The tool makes the worker the entry point: `main_worker(LOCAL_RANK, args)`, the Accelerator in
place of the process group, then `args.rank` / `args.world_size` from the accelerator (the worker
reads them later: `args.batch_size // args.world_size`, `if args.rank == 0:`). The model's forward
sums a cross-correlation over the processes with `torch.distributed.all_reduce` itself: guarded by
`is_initialized()`, so that one process (no process group) runs it too.

evaluate.py, the second entry (a linear evaluation with the same launcher, its evaluation on rank 0
only, its loss averaged with `torch.distributed.reduce`), is migrated the same way.

Checked: the output equals out/ and a second run changes nothing; at one process the migrated
script trains like the original (1 spawned process) - the same steps, learning rates and losses
(the original's `torch.cuda.amp` disables itself on a CPU, and so does the migrated
`Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no")`); it resumes from its own checkpoint; at two
gloo processes only the main process prints, each step has the same number (each process takes half
of every global batch of half the size: the same 6 steps per epoch), and the first step's loss,
computed before any update from the global batch summed over both processes, is the one-process one.
evaluate.py gives bit-identical losses and accuracies at one process (no AMP there); the one
two-process launch of this test is main.py's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.test_repos import REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun


def _stats(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"epoch"')]


def test_spawn_rank_repository_migrates_and_trains(tmp_path: Path) -> None:
    case = REPOS / "spawnrank"
    migrated, result = migrated_copy("spawnrank", tmp_path, ["evaluate.py", "main.py"])
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run is a no-op

    original = run_cmd([sys.executable, str(case / "in" / "main.py")], cwd=tmp_path, timeout=TIMEOUT)
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    one = run_cmd([sys.executable, str(migrated / "main.py")], cwd=one_dir, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr[-3000:] + one.stderr[-3000:]
    expected, got = _stats(original.stdout), _stats(one.stdout)
    assert [(s["epoch"], s["step"]) for s in expected] == [(e, s) for e in range(2) for s in range(6 * e, 6 * e + 6)]
    assert [(s["epoch"], s["step"], s["lr_weights"]) for s in got] == [
        (s["epoch"], s["step"], s["lr_weights"]) for s in expected]
    assert [s["loss"] for s in got] == pytest.approx([s["loss"] for s in expected], rel=1e-5)
    # the second entry, the linear evaluation of the backbone main.py saved: bit-identical at one process
    backbone = str(tmp_path / "checkpoint" / "backbone.pth")
    evaluations = []
    for index, repo in enumerate((case / "in", migrated)):
        (tmp_path / f"eval{index}").mkdir()
        evaluations.append(run_cmd([sys.executable, str(repo / "evaluate.py"), backbone],
                                   cwd=tmp_path / f"eval{index}", timeout=TIMEOUT))
    assert all(e.returncode == 0 for e in evaluations), "".join(e.stderr[-3000:] for e in evaluations)
    expected_eval, got_eval = (_stats(e.stdout) for e in evaluations)
    assert len(expected_eval) == 2 * (4 + 1) and sum("acc" in s for s in expected_eval) == 2
    assert got_eval == expected_eval

    resumed = run_cmd([sys.executable, str(migrated / "main.py"), "--epochs", "3"], cwd=one_dir, timeout=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(s["epoch"], s["step"]) for s in _stats(resumed.stdout)] == [(2, s) for s in range(12, 18)]

    two_dir = tmp_path / "two"
    two_dir.mkdir()
    two = torchrun(migrated / "main.py", cwd=two_dir, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    launched = _stats(two.stdout)
    assert [(s["epoch"], s["step"]) for s in launched] == [(s["epoch"], s["step"]) for s in got]  # rank 0 only
    assert launched[0]["loss"] == pytest.approx(got[0]["loss"], rel=1e-3)
    assert [s["loss"] for s in launched] == pytest.approx([s["loss"] for s in got], rel=3e-2)
