"""End to end: the shapes the rewrite used to break (issue 12, 1a/1b/2f) migrate into scripts that
train on 1 and on 2 processes.

Each script below is written for this test (synthetic data) and reproduces a shape seen in real
training code:
- `flag_branches`: the device is chosen in both branches of an `if` on a command-line flag, as a
  string that the script also tests as one (`pin_memory=device == "cuda"`, `"cuda" in device`).
  Before: the Accelerator was created in the first branch only (NameError on the other) and the
  string became a torch.device (`"cuda" in device` raised TypeError).
- `notebook_helper`: a module-level script (a notebook's shape) whose data helper prints, called
  before the device is chosen. Before: `accelerator.print` ran before `accelerator` existed.
- `init_helper`: the script's own `init_distributed_mode(args)` initialises the process group under
  torchrun. Before: the Accelerator was created above it, and the helper's second
  `init_process_group` failed on 2 processes.
- `rank_zero_eval`: a BatchNorm model evaluated after every epoch under `if rank == 0:`, under
  `torch.no_grad()`. Before: the main process ran the prepared (DDP) model's forward, which
  broadcasts its buffers, while the other process went on to the next epoch, whose prepared loader
  broadcasts its shuffle seed: gloo aborted with a collective mismatch. Now the main process calls
  `accelerator.unwrap_model(model)` (and prints the same validation loss as the original).
- `rank_zero_eval_function`: the same evaluation in a function of the script (`evaluate(model,
  val_loader)`, `torch.no_grad()` inside it) called under `if rank == 0:`. Before: the metric was
  gathered inside `evaluate` and its loader prepared, so the main process waited in a gather the
  other process never joined (and the forward was reported as running with autograd on). Now the
  loader stays whole, nothing is gathered, and `evaluate` is handed the unwrapped model.

For each: the CLI migrates it (exit 0); one process prints the same loss lines as the original
(same seed, bit-identical); two gloo processes exit 0, the main process alone prints, and each
rank runs half of every epoch's batches.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from rt_helpers import run_cmd, torchrun  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOSS = re.compile(r"^epoch (\d+) step (\d+) loss ([0-9.]+)$", re.M)
STEPS = re.compile(r"^rank (\d) steps (\d+)$", re.M)
TIMEOUT = 180

SCRIPTS = {
    "flag_branches": '''
        """Device chosen in both branches of an `if`, as a string the script tests as a string."""
        import argparse
        import os

        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--cpu", action="store_true")
            args = parser.parse_args()
            if not args.cpu and torch.cuda.is_available():
                print("using the GPU")
                device = "cuda"
            else:
                print("using the CPU")
                device = "cpu"
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
            loader = DataLoader(data, batch_size=8, shuffle=True, pin_memory=device == "cuda")
            model = nn.Linear(4, 1).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            kind = "gpu" if "cuda" in device else "cpu"
            for epoch in range(2):
                steps = 0
                for step, (x, y) in enumerate(loader):
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    steps += 1
                    print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            rank = os.environ.get("RANK", "0")
            open(f"steps-{rank}.txt", "w").write(f"rank {rank} steps {steps}\\n")
            print(f"done on {kind}")


        if __name__ == "__main__":
            main()
    ''',
    "notebook_helper": '''
        """A module-level script whose data helper prints, called before the device is chosen."""
        import os

        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def download(n):
            print(f"building {n} samples")
            return TensorDataset(torch.randn(n, 4), torch.randn(n, 1))


        torch.manual_seed(0)
        data = download(128)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(2):
            steps = 0
            for step, (x, y) in enumerate(loader):
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                steps += 1
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
        rank = os.environ.get("RANK", "0")
        open(f"steps-{rank}.txt", "w").write(f"rank {rank} steps {steps}\\n")
    ''',
    "init_helper": '''
        """The script's own helper initialises the process group when torchrun started it."""
        import os

        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        class Args:
            distributed = False
            rank = 0


        def init_distributed_mode(args):
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                args.rank = int(os.environ["RANK"])
                args.distributed = True
                dist.init_process_group(backend="gloo")


        def main(args):
            init_distributed_mode(args)
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
            loader = DataLoader(data, batch_size=8, shuffle=True)
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            for epoch in range(2):
                steps = 0
                for step, (x, y) in enumerate(loader):
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    steps += 1
                    print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
            open(f"steps-{args.rank}.txt", "w").write(f"rank {args.rank} steps {steps}\\n")


        if __name__ == "__main__":
            main(Args())
    ''',
    "rank_zero_eval": '''
        """BatchNorm model; the main process alone evaluates it after every epoch."""
        import os

        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset


        def main():
            rank = int(os.environ.get("RANK", "0"))
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
            loader = DataLoader(data, batch_size=8, shuffle=True)
            val_loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
            model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            for epoch in range(3):
                model.train()
                steps = 0
                for step, (x, y) in enumerate(loader):
                    x, y = x.to(device), y.to(device)
                    optimizer.zero_grad()
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    optimizer.step()
                    steps += 1
                    print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
                model.eval()
                if rank == 0:
                    total = 0.0
                    with torch.no_grad():
                        for x, y in val_loader:
                            x, y = x.to(device), y.to(device)
                            total += nn.functional.mse_loss(model(x), y, reduction="sum").item()
                    print(f"epoch {epoch} val {total / len(val_loader.dataset):.6f}")
            open(f"steps-{rank}.txt", "w").write(f"rank {rank} steps {steps}\\n")


        if __name__ == "__main__":
            main()
    ''',
}
SCRIPTS["rank_zero_eval_function"] = SCRIPTS["rank_zero_eval"].replace('''
        def main():''', '''
        def evaluate(model, loader, device):
            total = 0.0
            with torch.no_grad():
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    total += nn.functional.mse_loss(model(x), y, reduction="sum").item()
            return total / len(loader.dataset)


        def main():''').replace('''
                if rank == 0:
                    total = 0.0
                    with torch.no_grad():
                        for x, y in val_loader:
                            x, y = x.to(device), y.to(device)
                            total += nn.functional.mse_loss(model(x), y, reduction="sum").item()
                    print(f"epoch {epoch} val {total / len(val_loader.dataset):.6f}")''', '''
                if rank == 0:
                    print(f"epoch {epoch} val {evaluate(model, val_loader, device):.6f}")''')
STEPS_PER_EPOCH = 128 // 8
EPOCHS = {"rank_zero_eval": 3, "rank_zero_eval_function": 3}
VAL = re.compile(r"^epoch (\d+) val ([0-9.]+)$", re.M)


@lru_cache(maxsize=None)
def workdir(name: str, tmp_root: str) -> Path:
    """The original and its migration (by the CLI, with --output-dir) in a fresh folder."""
    folder = Path(tmp_root) / name
    (folder / "original").mkdir(parents=True)
    original = folder / "original" / f"{name}.py"
    original.write_text(textwrap.dedent(SCRIPTS[name]).lstrip())
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(folder / "migrated"), str(original)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return folder


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("safety_shapes"))


def _run(folder: Path, which: str, name: str, nproc: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir = folder / f"{which}-{nproc}"
    run_dir.mkdir(exist_ok=True)
    script = folder / which / f"{name}.py"
    if nproc == 1:
        proc = run_cmd([sys.executable, str(script)], cwd=run_dir, timeout=TIMEOUT)
    else:
        proc = torchrun(script, cwd=run_dir, nproc=nproc, timeout=TIMEOUT, original=which == "original")
    assert proc.returncode == 0, f"{which} on {nproc} process(es):\n{proc.stdout}\n{proc.stderr}"
    return proc, run_dir


def _steps(run_dir: Path) -> dict[int, int]:
    found: dict[int, int] = {}
    for path in run_dir.glob("steps-*.txt"):
        (rank, steps), = STEPS.findall(path.read_text())
        found[int(rank)] = int(steps)
    return found


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_migration_creates_the_accelerator_where_every_path_sees_it(name: str, tmp_root: str) -> None:
    migrated = (workdir(name, tmp_root) / "migrated" / f"{name}.py").read_text()
    assert "accelerator = Accelerator(" in migrated
    assert "accelerator.backward(loss)" in migrated
    if name == "flag_branches":
        assert migrated.count("device = accelerator.device.type") == 2
        assert migrated.index("accelerator = Accelerator(") < migrated.index("if not args.cpu")
    if name == "notebook_helper":
        assert migrated.index("accelerator = Accelerator()") < migrated.index("data = download(128)")
    if name == "init_helper":
        assert migrated.index("    init_distributed_mode(args)") < migrated.index("accelerator = Accelerator()")
    if name == "rank_zero_eval":
        # DDP's forward on the main process only would broadcast the BatchNorm buffers, a collective
        # the other process never joins (it is already in the next epoch's loader)
        assert "accelerator.unwrap_model(model)(x)" in migrated
    if name == "rank_zero_eval_function":
        assert "evaluate(accelerator.unwrap_model(model), val_loader, device)" in migrated
        assert "gather_for_metrics" not in migrated and "val_loader = accelerator.prepare" not in migrated


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_one_process_trains_like_the_original(name: str, tmp_root: str) -> None:
    folder = workdir(name, tmp_root)
    original, _ = _run(folder, "original", name, 1)
    migrated, run_dir = _run(folder, "migrated", name, 1)
    expected = LOSS.findall(original.stdout)
    assert len(expected) == EPOCHS.get(name, 2) * STEPS_PER_EPOCH
    assert LOSS.findall(migrated.stdout) == expected
    assert VAL.findall(migrated.stdout) == VAL.findall(original.stdout)
    assert _steps(run_dir) == {0: STEPS_PER_EPOCH}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_two_processes_train_their_share(name: str, tmp_root: str) -> None:
    folder = workdir(name, tmp_root)
    proc, run_dir = _run(folder, "migrated", name, 2)
    printed = LOSS.findall(proc.stdout)
    assert len(printed) == EPOCHS.get(name, 2) * STEPS_PER_EPOCH // 2, "only the main process prints, and it runs half the batches"
    if name.startswith("rank_zero_eval"):
        assert [int(e) for e, _ in VAL.findall(proc.stdout)] == [0, 1, 2], "the main process evaluates every epoch"
    assert _steps(run_dir) == {0: STEPS_PER_EPOCH // 2, 1: STEPS_PER_EPOCH // 2}
    assert all(math.isfinite(float(loss)) for _, _, loss in printed)
