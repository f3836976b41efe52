"""The ConvNeXt shape (fixtures/repos/scaler): a loss-scaler object of utils.py called by engine.py's
`train_one_epoch` inside a hand-written `update_freq` accumulation, an optimizer factory over
layer-decayed parameter groups, `model_without_ddp` aliasing the hand-wrapped model, a printed
DistributedSampler, a ModelEma and checkpoints holding the scaler's state. Migrated in place as one
unit, compared with out/, trained with `--use_amp true` (the scaler object's path; its GradScaler is
disabled on CPU, as in the original) at one process (identical losses) and two (each rank half of
every epoch, only the main process prints, the checkpoint with the scaler state is written once).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tests.e2e.test_repos import LOSS, REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun


def test_scaler_repository_migrates_as_one_unit_and_trains_the_same(tmp_path: Path) -> None:
    case = REPOS / "scaler"
    migrated, result = migrated_copy("scaler", tmp_path, ["engine.py", "main.py", "utils.py"])
    main = (migrated / "main.py").read_text()
    # the trained model is prepared (not its alias), the hand DDP and the sampler (and its print) go
    assert "accelerator.prepare(\n        model, optimizer, data_loader_train" in main
    assert "DistributedDataParallel" not in main and "sampler_train" not in main
    utils = (migrated / "utils.py").read_text()
    assert "self._scaler = torch.cuda.amp.GradScaler()" in utils  # the scaler object keeps its AMP
    assert "self.accelerator.backward(self._scaler.scale(loss)" in utils
    assert "AM006" in result.stdout + result.stderr
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run changes nothing

    flags = ["--use_amp", "true", "--device", "cpu"]
    original = run_cmd([sys.executable, "main.py", *flags], cwd=case / "in", timeout=TIMEOUT)
    one = run_cmd([sys.executable, "main.py", *flags], cwd=migrated, timeout=TIMEOUT)
    assert original.returncode == 0 and one.returncode == 0, original.stderr + one.stderr
    losses = LOSS.findall(original.stdout)
    assert len(losses) == 32  # 2 epochs x 16 micro-batches
    assert LOSS.findall(one.stdout) == losses

    out = tmp_path / "ckpt"
    two = torchrun(migrated / "main.py", "--use_amp", "true", "--output_dir", str(out), cwd=migrated, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    steps = [(int(e), int(s)) for e, s, _ in LOSS.findall(two.stdout)]
    assert steps == [(e, s) for e in range(2) for s in range(8)], two.stdout
    checkpoint = torch.load(out / "checkpoint-1.pth", map_location="cpu", weights_only=False)
    assert "scaler" in checkpoint and "model_ema" in checkpoint
    assert not any(k.startswith("module.") for k in checkpoint["model"])  # the user's module, unwrapped
