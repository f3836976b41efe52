"""Where `prepare` goes around training (issues 29 and 31), each shape migrated by the CLI and run
at 1 and 2 gloo processes.

- A self-spawning DDP script (`mp.spawn` worker, `model = DDP(model)`, optimizer, then a resume
  block `model.load_state_dict(ckpt["model"])` before the loader is built): the migration prepares
  the model and the optimizer before the resume and the loader after it, so a checkpoint the
  ORIGINAL script wrote from its DDP model (`module.` keys, run here on 1 process with a gloo world
  of 1) resumes the migrated script with strict loading, and the migrated script's own checkpoint
  (the user's keys) resumes it too.
- A solver class that keeps its loader, builds its model in a method its constructor calls in
  every mode, trains from the loader in `train()` and writes one file per batch of the same loader
  in `test()`: the loader is prepared on entry to `train()` only, so test mode at 2 processes
  writes every file once (exclusive create), with the original's contents.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

RESUME = '''
import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def worker(gpu, args):
    args.rank += gpu
    dist.init_process_group(
        backend="nccl" if torch.cuda.is_available() else "gloo",
        init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    if torch.cuda.is_available():
        torch.cuda.set_device(gpu)
        model = model.cuda(gpu)
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    path = os.path.join("runs", "checkpoint.pth")
    if os.path.isfile(path):
        ckpt = torch.load(path, map_location="cpu")
        start_epoch = ckpt["epoch"]
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        print(f"resumed at epoch {start_epoch}")
    else:
        start_epoch = 0

    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    for epoch in range(start_epoch, start_epoch + 2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if torch.cuda.is_available():
                x, y = x.cuda(gpu), y.cuda(gpu)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.rank == 0:
            os.makedirs("runs", exist_ok=True)
            state = dict(epoch=epoch + 1, model=model.state_dict(), optimizer=optimizer.state_dict())
            torch.save(state, path)
    print(f"trained to epoch {start_epoch + 2}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=1)
    args = parser.parse_args()
    args.rank = 0
    args.world_size = args.nprocs
    args.dist_url = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(worker, (args,), args.nprocs)


if __name__ == "__main__":
    main()
'''

USER_KEYS = ["0.bias", "0.weight", "2.bias", "2.weight"]


def _keys(path: Path) -> list[str]:
    return sorted(torch.load(path, map_location="cpu")["model"])


def _loads_strictly_into_user_class(path: Path) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    outcome = model.load_state_dict(torch.load(path, map_location="cpu")["model"], strict=True)
    assert not outcome.missing_keys and not outcome.unexpected_keys


def test_original_ddp_checkpoint_resumes_migrated_script(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", RESUME, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    # the model and optimizer are prepared before the resume, the loader after it is built
    assert migrated.index("model, optimizer = accelerator.prepare(model, optimizer)") < migrated.index(
        'model.load_state_dict(ckpt["model"])') < migrated.index("loader = accelerator.prepare(loader)")

    # the original, on 1 process (a DDP gloo world of 1), writes DDP's `module.` keys
    first, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    assert "trained to epoch 2" in first.stdout
    assert _keys(original_dir / "runs" / "checkpoint.pth") == [f"module.{k}" for k in USER_KEYS]

    for nproc in (1, 2):
        run_dir = folder / f"migrated-{nproc}"
        run_dir.mkdir()
        shutil.copytree(original_dir / "runs", run_dir / "runs")
        # the original's checkpoint resumes the migrated script (strict load into the prepared model)
        resumed, _ = run_copy(folder, "migrated", "train.py", nproc, TIMEOUT)
        assert "resumed at epoch 2" in resumed.stdout and "trained to epoch 4" in resumed.stdout, resumed.stdout
        checkpoint = run_dir / "runs" / "checkpoint.pth"
        assert _keys(checkpoint) == USER_KEYS
        _loads_strictly_into_user_class(checkpoint)
        # and the migrated script's own checkpoint resumes it again
        again, _ = run_copy(folder, "migrated", "train.py", nproc, TIMEOUT)
        assert "resumed at epoch 4" in again.stdout and "trained to epoch 6" in again.stdout, again.stdout


TEST_MODE = '''
import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Solver:
    def __init__(self, loader, config):
        self.loader = loader
        self.epochs = config.epochs
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.build_model()

    def build_model(self):
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        self.optimizer = torch.optim.Adam(self.net.parameters(), 1e-2)
        self.net.to(self.device)

    def train(self):
        data_loader = self.loader
        seen = 0
        for epoch in range(self.epochs):
            for x, y in data_loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = nn.functional.mse_loss(self.net(x), y)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                seen += len(x)
        print(f"trained on {seen} samples")
        torch.save(self.net.state_dict(), "net.pth")

    def test(self):
        self.net.load_state_dict(torch.load("net.pth", map_location="cpu"))
        os.makedirs("results", exist_ok=True)
        with torch.no_grad():
            for i, (x, y) in enumerate(self.loader):
                out = self.net(x.to(self.device))
                with open(os.path.join("results", f"batch-{i}.txt"), "x") as f:
                    f.write(" ".join(f"{v:.5f}" for v in out.flatten().tolist()))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="train")
    parser.add_argument("--epochs", type=int, default=2)
    config = parser.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=4, shuffle=config.mode == "train")
    solver = Solver(loader, config)
    if config.mode == "train":
        solver.train()
    else:
        solver.test()


if __name__ == "__main__":
    main()
'''


def test_test_mode_writes_every_file_once(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "solver.py", TEST_MODE, TIMEOUT)
    migrated = (folder / "migrated" / "solver.py").read_text()
    assert "loader = self.accelerator.prepare(self.loader)" in migrated
    assert "self.net, self.optimizer = self.accelerator.prepare(self.net, self.optimizer)" in migrated

    trained = {}
    for nproc in (1, 2):
        run, run_dir = run_copy(folder, "migrated", "solver.py", nproc, TIMEOUT)
        # each process trains on its share: 2 epochs of 32 samples over the processes
        assert f"trained on {64 // nproc} samples" in run.stdout, run.stdout
        trained[nproc] = run_dir
    # the original writes 8 result files from the 2-process checkpoint
    original_dir = folder / "original-1"
    original_dir.mkdir()
    shutil.copy(trained[2] / "net.pth", original_dir / "net.pth")
    for which in ("original", "migrated"):  # test mode from now on
        script = folder / which / "solver.py"
        script.write_text(script.read_text().replace('default="train"', 'default="test"'))
    run_copy(folder, "original", "solver.py", 1, TIMEOUT)
    expected = {p.name: p.read_text() for p in (original_dir / "results").iterdir()}
    assert len(expected) == 8

    for nproc in (1, 2):
        run_dir = folder / f"migrated-{nproc}"
        if run_dir != trained[2]:
            shutil.copy(trained[2] / "net.pth", run_dir / "net.pth")
        # `open(..., "x")`: a file written twice would fail the run
        run_copy(folder, "migrated", "solver.py", nproc, TIMEOUT)
        written = {p.name: p.read_text() for p in (run_dir / "results").iterdir()}
        assert written == expected, (nproc, sorted(written))
