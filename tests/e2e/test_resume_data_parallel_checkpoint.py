"""A module-level script that wraps its model in `torch.nn.DataParallel` behind a flag and, under
`--resume`, loads a checkpoint it wrote itself before building the optimizer (the shape of
kentaroy47's vision-transformers-cifar10 train_cifar10.py). A checkpoint the ORIGINAL wrote with
the flag holds `module.` keys; the migration removes the wrap and prepares the model alone where
it stood, before the load, so the migrated script resumes from that checkpoint with strict
loading at 1 and 2 gloo processes, and from its own checkpoint (the user's keys) too. DataParallel
runs on the CPU as a pass-through with the `module.` prefix, so the original runs here."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into  # noqa: E402
from rt_helpers import run_cmd, torchrun  # noqa: E402

TIMEOUT = 180
NAME = "train.py"
SCRIPT = (Path(__file__).resolve().parents[2] / "fixtures" / "prepare_training_objects"
          / "resume_after_guarded_data_parallel.in.py").read_text()
KEYS = ["0.bias", "0.weight", "1.bias", "1.num_batches_tracked", "1.running_mean", "1.running_var", "1.weight",
        "3.bias", "3.weight"]


def _run(script: Path, cwd: Path, nproc: int, *args: str) -> None:
    cwd.mkdir(parents=True, exist_ok=True)
    if nproc == 1:
        proc = run_cmd([sys.executable, str(script), *args], cwd=cwd, timeout=TIMEOUT)
    else:
        proc = torchrun(script, *args, cwd=cwd, nproc=nproc, timeout=TIMEOUT)
    assert proc.returncode == 0, f"{script} {args} on {nproc}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / "ckpt" / "classifier.pt")


def test_resume_from_original_data_parallel_checkpoint(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, NAME, SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / NAME).read_text()
    assert "torch.nn.DataParallel(" not in migrated
    assert migrated.index("classifier = accelerator.prepare(classifier)") < migrated.index("if args.resume:")
    first = folder / "original-dp"
    _run(folder / "original" / NAME, first, 1, "--data-parallel", "--epochs", "1")
    written = _checkpoint(first)
    assert sorted(written["classifier"]) == sorted(f"module.{k}" for k in KEYS) and written["epoch"] == 1
    for nproc in (1, 2):
        run_dir = folder / f"migrated-resume-{nproc}"
        shutil.copytree(first / "ckpt", run_dir / "ckpt")
        _run(folder / "migrated" / NAME, run_dir, nproc, "--resume", "--epochs", "3")
        resumed = _checkpoint(run_dir)
        assert resumed["epoch"] == 3 and sorted(resumed["classifier"]) == KEYS
        # the loaded weights were trained on, not replaced by a fresh model
        assert not torch.equal(resumed["classifier"]["0.weight"], written["classifier"]["module.0.weight"])


def test_resume_from_own_checkpoint(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, NAME, SCRIPT, TIMEOUT)
    run_dir = folder / "migrated-own"
    _run(folder / "migrated" / NAME, run_dir, 2, "--epochs", "1")
    assert sorted(_checkpoint(run_dir)["classifier"]) == KEYS
    _run(folder / "migrated" / NAME, run_dir, 2, "--resume", "--epochs", "2")
    assert _checkpoint(run_dir)["epoch"] == 2
    _run(folder / "migrated" / NAME, run_dir, 1, "--resume", "--epochs", "3")
    assert _checkpoint(run_dir)["epoch"] == 3
