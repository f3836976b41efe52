"""A torchrun DDP script that keeps each process's BatchNorm statistics its own
(`DDP(model, broadcast_buffers=False)`), migrated with the CLI: the wrap goes and the option goes
to `Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)])`
(AM007, `migrate/ddp_options.py`). The original runs under torchrun (the reference) and the
migrated copy as plain `python` (1 process) and under torchrun (2 gloo processes): every rank ends
with the same BatchNorm statistics and weights as the original's rank, so at 2 processes the two
ranks' statistics stay different (each from its own samples) while the weights agree. Without the
option carried, DDP broadcasts rank 0's buffers before every forward and rank 1's statistics would
follow rank 0's. Batches of one sample (a Conv1d feeds the BatchNorm, so it still sees 6 values
per channel) make the prepared loader give each rank the same samples as the original's
`DistributedSampler(shuffle=False)`: rank r gets samples r, r+2, ..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402
from rt_helpers import torchrun  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(24, 1))
    model = DDP(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(16, 3, 8) + torch.arange(16).view(16, 1, 1) * 0.5
    y = torch.randn(16, 1)
    data = TensorDataset(x, y)
    loader = DataLoader(data, batch_size=1, sampler=DistributedSampler(data, shuffle=False))
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    bn = model.module[1]
    result = {
        "running_mean": bn.running_mean.tolist(),
        "running_var": bn.running_var.tolist(),
        "weight": model.module[4].weight.flatten().tolist(),
    }
    with open(f"rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def _ranks(run_dir: Path, nproc: int) -> list[dict]:
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def _original(folder: Path, nproc: int) -> list[dict]:
    run_dir = folder / f"original-{nproc}"
    run_dir.mkdir()
    proc = torchrun(folder / "original" / "train.py", cwd=run_dir, nproc=nproc, timeout=TIMEOUT, original=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _ranks(run_dir, nproc)


def _close(a: list[float], b: list[float]) -> bool:
    return a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_broadcast_buffers_false_carried_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)]" in migrated
    assert "DDP(" not in migrated

    reference = _original(folder, 1)
    _, one_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert _ranks(one_dir, 1) == reference

    reference = _original(folder, 2)
    _, two_dir = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    two = _ranks(two_dir, 2)
    # the reference's ranks keep their own statistics; the weights are shared
    assert not _close(reference[0]["running_mean"], reference[1]["running_mean"])
    assert _close(reference[0]["weight"], reference[1]["weight"])
    for rank in range(2):
        for key in ("running_mean", "running_var", "weight"):
            assert _close(two[rank][key], reference[rank][key]), (rank, key, two[rank][key], reference[rank][key])
