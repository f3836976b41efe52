"""fixtures/repos/hiddenstep: the DeiT shape, whose training step runs inside a loss scaler of a
package the migration never reads (`loss_scaler(loss, optimizer, clip_grad=..., parameters=...)`,
timm's NativeScaler shape: backward, unscale, clipping and step in its `__call__`; no `.backward()`
anywhere), with the optimizer from that package's factory over `model_without_ddp`, a
weight-averaged copy of the model (`ModelEma(model)` before the hand DDP, `model_ema.update(model)`
with the trained model), `utils.init_distributed_mode(args)`, a DistributedSampler under
`args.distributed` and `save_on_master` checkpoints holding the scaler's state.

The step is kept as it is (its GradScaler scales the loss of the kept autocast, AM006), the model
is prepared in place of the hand DDP, the sampler is kept (hand sharding). The package
(tests/e2e/hiddenstep_lib/ampkit, its GradScaler enabled on the CPU) is copied beside the
repository only to run it, after the migration. Checked: the output equals out/ and a second run
changes nothing; at one process (no launcher) the migrated script trains bit-identically to the
original (losses, weights, EMA weights, validation loss); at two gloo processes under torchrun each
rank sees the original's samples and ends with the original DDP run's weights and EMA weights, and
the checkpoint holds the bare module's keys and the scaler's state.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.test_repos import REPOS, TIMEOUT, migrate, migrated_copy
from tests.runtime.rt_helpers import run_cmd, torchrun

PACKAGE = Path(__file__).resolve().parent / "hiddenstep_lib" / "ampkit"


def test_step_hidden_in_a_package_scaler_migrates_and_trains_as_the_original(tmp_path: Path) -> None:
    import torch

    migrated, result = migrated_copy("hiddenstep", tmp_path, ["engine.py", "main.py"])
    said = result.stdout + result.stderr
    assert "AM006" in said and "AM003" not in said
    engine = (migrated / "engine.py").read_text()
    assert "loss_scaler(loss, optimizer, clip_grad=max_norm" in engine  # the step kept as it is
    assert 'torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp)' in engine
    main = (migrated / "main.py").read_text()
    assert "DistributedDataParallel" not in main and "accelerator.prepare(" in main
    assert "model_ema = ModelEma(model, decay=0.9)" in main and "model.to(device)" in main
    again = migrate(migrated, "--check")
    assert again.returncode == 0, again.stdout + again.stderr  # a second run is a no-op

    original = tmp_path / "original"
    shutil.copytree(REPOS / "hiddenstep" / "in", original)
    for repo in (original, migrated):
        shutil.copytree(PACKAGE, repo / "ampkit")
    outs: dict[tuple[str, int], tuple[list[dict], str, Path]] = {}
    for how, repo in (("original", original), ("migrated", migrated)):
        for nproc in (1, 2):
            out = tmp_path / f"{how}{nproc}"
            out.mkdir()
            args = ["--output", str(out), "--model_ema"]
            if nproc == 1:
                run = run_cmd([sys.executable, str(repo / "main.py"), *args], cwd=out, timeout=TIMEOUT)
            else:
                run = torchrun(repo / "main.py", *args, cwd=out, timeout=TIMEOUT)
            assert run.returncode == 0, f"{how} x{nproc}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
            outs[how, nproc] = (ranks, run.stdout, out)

    (one_original,), original_stdout, _ = outs["original", 1]
    (one,), one_stdout, _ = outs["migrated", 1]
    assert (one["rank"], one["world_size"]) == (0, 1) and len(one["seen"]) == 2 * 64
    assert one == one_original  # losses, samples, weights, EMA weights, validation loss
    assert one_stdout == original_stdout

    two_original, _, _ = outs["original", 2]
    two, two_stdout, two_dir = outs["migrated", 2]
    assert [(r["rank"], r["world_size"]) for r in two] == [(0, 2), (1, 2)]
    for before, after in zip(two_original, two, strict=True):
        assert after["seen"] == before["seen"] and len(after["seen"]) == 2 * 32
        assert after["losses"] == pytest.approx(before["losses"], abs=1e-6)
        assert after["weights"] == pytest.approx(before["weights"], abs=1e-6)
        assert after["ema"] == pytest.approx(before["ema"], abs=1e-6) and after["ema"] != after["weights"]
        assert after["val"] == pytest.approx(before["val"], rel=1e-5)
    assert two[0]["weights"] == two[1]["weights"] and two[0]["ema"] == two[1]["ema"]
    assert two_stdout.count(" val ") == 2  # the main process prints, once per epoch
    checkpoint = torch.load(two_dir / "checkpoint.pth", weights_only=False)
    assert sorted(checkpoint["model"]) == ["bias", "weight"] and checkpoint["epoch"] == 1
    assert checkpoint["scaler"]["scale"] > 0 and sorted(checkpoint["model_ema"]) == ["bias", "weight"]
