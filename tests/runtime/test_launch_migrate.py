"""``accel launch --migrate``: an unmodified single-device script runs on 2 gloo processes through a
migrated temporary copy; a script whose migration leaves diagnostics is refused before any launch."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from rt_helpers import run_cmd
from runtime.cli import build_parser, main
from runtime.launch import WORKER_ENTRY, torchrun_argv

ACCEL = shutil.which("accel") or str(Path(sys.executable).with_name("accel"))

# A plain script as a user has it: a model class in a sibling module, a file read next to the
# script through __file__, a checkpoint written relative to the working directory.
TINYNET = """
import torch.nn as nn


class TinyNet(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x):
        return self.linear(x)
"""

TRAIN = """
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from tinynet import TinyNet


def main():
    scale = float(Path(__file__).with_name("scale.txt").read_text())
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=generator)
    y = x.sum(dim=1, keepdim=True) * scale
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = TinyNet(4).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(int(sys.argv[1])):
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.6f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
"""

# The loop iterates a list, not a DataLoader: AM004 cannot prepare it (every rank would train on
# all the data), so the launch must be refused, before the script's first line runs.
REFUSED = """
from pathlib import Path

import torch

Path("launched.txt").write_text("the script ran")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
for x, y in batches:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""


def _project(tmp_path: Path) -> tuple[Path, Path]:
    project, workdir = tmp_path / "project", tmp_path / "work"
    project.mkdir()
    workdir.mkdir()
    (project / "tinynet.py").write_text(TINYNET)
    (project / "scale.txt").write_text("0.5\n")
    (project / "train.py").write_text(TRAIN)
    (project / "refused.py").write_text(REFUSED)
    return project, workdir


def test_unmodified_script_trains_on_two_processes_and_is_not_written(tmp_path: Path, monkeypatch) -> None:
    project, workdir = _project(tmp_path)
    script = project / "train.py"
    before, mtime = script.read_bytes(), script.stat().st_mtime_ns
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # where the temporary copy goes (and must go away)
    proc = run_cmd([ACCEL, "launch", "--migrate", "--nproc-per-node", "2", "--cpu", str(script), "2"], workdir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"train\.py: \d+ changes in a temporary copy \(AM001 x1, ", proc.stderr), proc.stderr
    losses = [float(m) for m in re.findall(r"^epoch \d loss (\S+)$", proc.stdout, re.M)]
    # 64 samples in batches of 8 over 2 processes: 4 steps per epoch, printed by the main process only.
    assert len(losses) == 8, proc.stdout
    assert losses[-1] < losses[0] / 4
    assert (workdir / "model.pt").is_file()  # the working directory is the user's, not the copy's
    assert script.read_bytes() == before and script.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in project.iterdir()) == ["refused.py", "scale.txt", "tinynet.py", "train.py"]
    assert not list(temp.glob("accel-launch-migrate-*"))


def test_refused_migration_exits_2_with_the_reason_and_launches_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    project, workdir = _project(tmp_path)
    monkeypatch.chdir(workdir)  # in-process: the refusal comes before torch is even imported
    assert main(["launch", "--migrate", "--nproc-per-node", "2", str(project / "refused.py")]) == 2
    err = capsys.readouterr().err
    assert "refused.py:10: AM004 warning: training loop iterates `batches`" in err
    assert "accel launch: error:" in err and "not launched" in err
    assert "torch.distributed" not in err and not (workdir / "launched.txt").exists()
    assert (project / "refused.py").read_text() == REFUSED
    plain = project / "plain.py"
    plain.write_text("import torch\nprint(torch.ones(2))\n")  # nothing to migrate: N copies, refused
    assert main(["launch", "--migrate", str(plain)]) == 2
    assert "no training code" in capsys.readouterr().err
    assert main(["launch", "--migrate", "-m", "train"]) == 2
    assert "--migrate needs a script file" in capsys.readouterr().err


def test_shadowing_runtime_module_and_notebooks_are_refused_before_migrating(tmp_path: Path, capsys) -> None:
    project, _ = _project(tmp_path)
    (project / "runtime.py").write_text("")
    assert main(["launch", "--migrate", str(project / "train.py")]) == 2
    assert "runtime.py shadows the bundled runtime package" in capsys.readouterr().err
    notebook = tmp_path / "train.ipynb"
    notebook.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    assert main(["launch", "--migrate", str(notebook)]) == 2
    assert "not notebooks" in capsys.readouterr().err


def test_workers_run_the_copy_as_the_script() -> None:
    args = build_parser().parse_args(["launch", "--migrate", "train.py", "--lr", "1"])
    args.migrated_copy = Path("/tmp/x/copy/train.py")
    expected = [str(WORKER_ENTRY), "--migrated", "/tmp/x/copy/train.py", "train.py", "--lr", "1"]
    assert torchrun_argv(args)[-6:] == expected
