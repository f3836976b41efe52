"""Hand-written DDP / DataParallel wraps that AM007 removes wherever the training step finds them
(issue 31 item 3: never keep a wrapper beside prepare, never remove one and leave its users):
a wrap inside a helper whose value `main` binds to the model (`def wrap(m): return DDP(m, ...)`),
a builder's `if distributed: model = DDP(model)`, `model = DDP(model) if ... else model`, and a
trainer class's second attribute `self.ddp_model = DDP(self.model)` written before its loader.
Each script is migrated with the CLI; the original runs under torchrun with gloo (the reference)
at 1 and 2 processes, the migrated copy as plain `python` and under `accel launch
--nproc-per-node 2 --cpu`: every rank's losses and final weights equal the reference's (batches
of one sample, so the prepared loader gives rank r the samples r, r+2, ... as the original's
`DistributedSampler(shuffle=False)` does). A DataParallel alias has no distributed reference (the
original does not average gradients across processes): the migrated copy equals the original at
1 process and ends with equal weights on both ranks at 2."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into  # noqa: E402
from rt_helpers import run_cmd, torchrun  # noqa: E402

TIMEOUT = 180

HEAD = '''
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x):
        return self.body(x)

'''

MAIN = '''

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
{build}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g))
    loader = DataLoader(data, batch_size=1, sampler=DistributedSampler(data, shuffle=False))
    losses = []
    for epoch in range(2):
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    with open(f"rank{{rank}}.json", "w") as f:
        json.dump({{"losses": losses, "weights": weights}}, f)
    dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

SHAPES = {
    "wrap_helper": (
        "def wrap(m):\n    return DDP(m, find_unused_parameters=True)\n",
        "    model = wrap(Net())",
    ),
    "build_helper_under_flag": (
        "def build(distributed):\n    model = Net()\n    if distributed:\n        model = DDP(model)\n    return model\n",
        "    model = build(dist.get_world_size() > 1)",
    ),
    "conditional_expression": (
        "",
        "    model = Net()\n    model = DDP(model) if dist.get_world_size() > 1 else model",
    ),
}

TRAINER = HEAD + '''

class Trainer:
    def __init__(self):
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()
        torch.manual_seed(0)
        self.model = Net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.ddp_model = {wrap}
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g))
        self.loader = DataLoader(data, batch_size=1, sampler=DistributedSampler(data, shuffle=False))

    def train(self):
        losses = []
        for epoch in range(2):
            for xb, yb in self.loader:
                loss = nn.functional.mse_loss(self.ddp_model(xb), yb)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                losses.append(loss.item())
        weights = [p.detach().flatten().tolist() for p in self.model.parameters()]
        with open(f"rank{{self.rank}}.json", "w") as f:
            json.dump({{"losses": losses, "weights": weights}}, f)
        dist.barrier()  # gloo aborts a rank whose peer closes its sockets first
        dist.destroy_process_group()


if __name__ == "__main__":
    Trainer().train()
'''


def _script(shape: str) -> str:
    if shape == "trainer_alias_before_loader":
        return TRAINER.format(wrap="DDP(self.model)")
    if shape == "trainer_dataparallel_alias_before_loader":
        return TRAINER.format(wrap="nn.DataParallel(self.model)")
    helper, build = SHAPES[shape]
    return HEAD + helper + MAIN.format(build=build)


def _ranks(run_dir: Path, nproc: int) -> list[dict]:
    return [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def _run(folder: Path, how: str, nproc: int) -> list[dict]:
    run_dir = folder / f"{how}-{nproc}"
    run_dir.mkdir()
    if how == "original":
        proc = torchrun(folder / "original" / "train.py", cwd=run_dir, nproc=nproc, timeout=TIMEOUT,
                        original=True)
    elif nproc == 1:
        proc = run_cmd([sys.executable, str(folder / "migrated" / "train.py")], cwd=run_dir, timeout=TIMEOUT)
    else:
        accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
        assert accel, "the `accel` console script is not installed"
        proc = run_cmd([accel, "launch", "--nproc-per-node", str(nproc), "--cpu", str(folder / "migrated" / "train.py")],
                       cwd=run_dir, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{how} on {nproc}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return _ranks(run_dir, nproc)


def _close(a: object, b: object) -> bool:
    flat = lambda v: [x for row in v for x in (row if isinstance(row, list) else [row])]  # noqa: E731
    return flat(a) == pytest.approx(flat(b), rel=1e-5, abs=1e-6)


def _migrated(tmp_path: Path, shape: str) -> Path:
    folder = migrate_into(tmp_path, "train.py", _script(shape), TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "DDP(" not in migrated and "DataParallel(" not in migrated, migrated
    assert "accelerator.prepare(" in migrated, migrated
    return folder


@pytest.mark.parametrize("shape", [*SHAPES, "trainer_alias_before_loader"])
def test_wrap_removed_trains_as_the_original_at_1_and_2_processes(tmp_path: Path, shape: str) -> None:
    folder = _migrated(tmp_path, shape)
    assert _run(folder, "migrated", 1) == _run(folder, "original", 1)
    reference = _run(folder, "original", 2)
    two = _run(folder, "migrated", 2)
    assert _close(reference[0]["weights"], reference[1]["weights"])  # the original averages gradients
    for rank in range(2):
        assert _close(two[rank]["losses"], reference[rank]["losses"]), (rank, two[rank], reference[rank])
        assert _close(two[rank]["weights"], reference[rank]["weights"]), rank


def test_dataparallel_alias_before_loader_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = _migrated(tmp_path, "trainer_dataparallel_alias_before_loader")
    assert _run(folder, "migrated", 1) == _run(folder, "original", 1)
    two = _run(folder, "migrated", 2)
    assert _close(two[0]["weights"], two[1]["weights"])
    assert two[0]["losses"] != two[1]["losses"]  # each rank trained on its own half
