"""An Accelerator created after the script built the default process group itself from variables
other than torchrun's (SLURM's `SLURM_PROCID` / `SLURM_NTASKS`, no RANK / WORLD_SIZE) joins that
group: its rank and size, gradients averaged by `prepare`'s DDP (reader 30, deit under
`srun`/submitit). The environment contradicting the group is an error naming both.

The 2-process tests start two plain Python processes (what `srun` does; torchrun would set
RANK and WORLD_SIZE), each with a timeout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from runtime.errors import DistributedEnvironmentError
from runtime.state import ProcessState, _local_rank

from rt_helpers import WORKERS, free_port, srun


def _srun(mode: str, out: Path, extra_env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    url = f"tcp://127.0.0.1:{free_port()}"
    return srun([sys.executable, str(WORKERS / "existing_group.py"), mode, url, str(out)], out, extra_env=extra_env)


def test_accelerator_joins_a_group_built_from_slurm_variables(tmp_path) -> None:
    procs = _srun("join", tmp_path)
    assert all(p.returncode == 0 for p in procs), "\n".join(p.stdout + p.stderr for p in procs)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, r in enumerate(ranks):
        assert (r["num_processes"], r["process_index"], r["local_process_index"]) == (2, rank, rank)
        assert r["wrapped"]  # prepare built DDP around the model
    # different data on each rank, averaged gradients: the same weights after the step
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_environment_contradicting_the_group_is_an_error_naming_both(tmp_path) -> None:
    procs = _srun("mismatch", tmp_path, {"WORLD_SIZE": "4"})
    assert not list(tmp_path.glob("rank*.json"))
    for rank, proc in enumerate(procs):
        assert proc.returncode != 0
        assert "DistributedEnvironmentError" in proc.stderr
        assert f"a process group already exists with rank {rank} of 2, but the environment says WORLD_SIZE=4" in proc.stderr


# -- in-process: which local rank a joined group gets ---------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({"LOCAL_RANK": "1", "SLURM_LOCALID": "3"}, 1),
    ({"SLURM_LOCALID": "3"}, 3),
    ({}, 5),  # no GPU, no variable: the rank (one node)
])
def test_local_rank_of_a_joined_group(env, expected, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _local_rank(env, rank=5) == expected


def test_local_rank_of_a_joined_group_from_the_gpus(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert _local_rank({}, rank=6) == 2  # rank % the node's GPUs
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _local_rank({}, rank=6) == 3  # the device the script set


def test_one_process_group_and_environment_disagreeing_in_process(tmp_path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert ProcessState.from_env(cpu=True, environ={}).world_size == 1
        with pytest.raises(DistributedEnvironmentError, match="rank 0 of 1, but the environment says RANK=0, WORLD_SIZE=2"):
            ProcessState.from_env(cpu=True, environ={"WORLD_SIZE": "2", "RANK": "0"})
    finally:
        dist.destroy_process_group()
