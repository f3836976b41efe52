"""fixtures/repos/initdistmode: the DeiT / MAE / DINO lineage's `utils.init_distributed_mode(args)`
(RANK / WORLD_SIZE / LOCAL_RANK or SLURM, `args.gpu`, `args.distributed`, `init_process_group`,
`barrier`, a patched `print`), `model_without_ddp`, a DistributedSampler built from
`utils.get_world_size()` / `utils.get_rank()`, and `utils.save_on_master`, migrated and trained.

The tool keeps utils.py as it is (its group, which the Accelerator joins after it; its rank helpers
keep their meaning), creates the Accelerator right after `init_distributed_mode(args)` in main.py,
prepares the model once in place of the hand DDP (`model_without_ddp` stays the bare module the
optimizer and the checkpoint use) and keeps the sampler (reported: the loader is not prepared).

Checked: the output equals out/ and a second run changes nothing; at one process (plain `python`,
no launcher: not distributed, as before) the migrated script trains bit-identically to the
original; at two gloo processes under torchrun, each rank trains on the same samples with the same
losses as the original's, both end with the original's weights, and the checkpoint `save_on_master`
writes holds the bare module's keys. The same at two processes started as `srun` starts them
(SLURM_PROCID only, no RANK / WORLD_SIZE: the helper's SLURM branch builds the group, the
Accelerator joins it; reader 30's deit under submitit): the migrated ranks train as the original's
and end with equal weights (before the runtime joined such a group, `prepare` returned the bare
model and each rank trained alone).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.test_repos import REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import free_port, run_cmd, srun, torchrun


def _ranks(out: Path, nproc: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def test_init_distributed_mode_repository_migrates_and_trains(tmp_path: Path) -> None:
    import torch

    original_repo = REPOS / "initdistmode" / "in"
    migrated, _ = migrated_copy("initdistmode", tmp_path, ["main.py"])
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run is a no-op
    outs = {}
    for how, repo in (("original", original_repo), ("migrated", migrated)):
        for nproc in (1, 2):
            out = tmp_path / f"{how}{nproc}"
            out.mkdir()
            if nproc == 1:
                result = run_cmd([sys.executable, str(repo / "main.py"), "--output", str(out)], cwd=out, timeout=TIMEOUT)
            else:
                result = torchrun(repo / "main.py", "--output", str(out), cwd=out, timeout=TIMEOUT,
                                  original=how == "original")
            assert result.returncode == 0, f"{how} x{nproc}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            outs[how, nproc] = (_ranks(out, nproc), result.stdout, out)
    (one_original,), _, _ = outs["original", 1]
    (one,), one_stdout, _ = outs["migrated", 1]
    assert (one["rank"], one["world_size"]) == (0, 1)
    assert one == one_original and len(one["seen"]) == 3 * 64
    assert one_stdout.count("epoch ") == 3

    two_original, _, _ = outs["original", 2]
    two, two_stdout, two_dir = outs["migrated", 2]
    assert [(r["rank"], r["world_size"]) for r in two] == [(0, 2), (1, 2)]
    for before, after in zip(two_original, two, strict=True):
        assert after["seen"] == before["seen"] and len(after["seen"]) == 3 * 32
        assert after["losses"] == pytest.approx(before["losses"], abs=1e-6)
        assert after["weights"] == pytest.approx(before["weights"], abs=1e-6)
    assert two[0]["weights"] == two[1]["weights"]
    assert two_stdout.count("epoch ") == 3  # the main process prints, once per epoch
    checkpoint = torch.load(two_dir / "checkpoint.pth")
    assert sorted(checkpoint["model"]) == ["bias", "weight"] and checkpoint["epoch"] == 2


def test_init_distributed_mode_slurm_branch_trains_as_the_original(tmp_path: Path) -> None:
    original_repo = REPOS / "initdistmode" / "in"
    migrated, _ = migrated_copy("initdistmode", tmp_path, ["main.py"])
    runs = {}
    for how, repo in (("original", original_repo), ("migrated", migrated)):
        out = tmp_path / f"{how}-srun"
        out.mkdir()
        procs = srun([sys.executable, str(repo / "main.py"), "--output", str(out), "--world_size", "2",
                      "--dist_url", f"tcp://127.0.0.1:{free_port()}"], cwd=out, timeout=TIMEOUT)
        for proc in procs:
            assert proc.returncode == 0, f"{how}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        runs[how] = _ranks(out, 2)
    assert [(r["rank"], r["world_size"]) for r in runs["migrated"]] == [(0, 2), (1, 2)]
    for before, after in zip(runs["original"], runs["migrated"], strict=True):
        assert after["seen"] == before["seen"] and len(after["seen"]) == 3 * 32
        assert after["losses"] == pytest.approx(before["losses"], abs=1e-6)
        assert after["weights"] == pytest.approx(before["weights"], abs=1e-6)
    assert runs["migrated"][0]["weights"] == runs["migrated"][1]["weights"]
