"""Scripts that shard by hand, migrated with the CLI and run under `accel launch --nproc-per-node 2`.

`sharding_scripts/fsdp_blocks.py` shards each block and then the model with FSDP2's `fully_shard`;
`sharding_scripts/zero_adamw.py` wraps DDP and a ZeroRedundancyOptimizer over AdamW. AM007 removes
the sharding and writes `Accelerator(strategy="fsdp")` / `Accelerator(strategy="zero1")`. Run on 2
gloo processes, each migrated script must train to the weights of one process training on the same
global batches (the runtime's loader hands rank r the batches r, r+2, ...: the two ranks' batches
of a step are the samples a DistributedSampler without shuffle gives them), with each rank holding
only part of the parameters (fsdp) or of the optimizer state (zero1). Every run has a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "sharding_scripts"
TIMEOUT = 240


@lru_cache(maxsize=None)
def _migrated() -> Path:
    work = Path(tempfile.mkdtemp(prefix="hand-sharding-"))
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(work / "migrated"), str(SCRIPTS)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 diagnostics" in result.stdout + result.stderr
    return work / "migrated"


def _check_migrated(name: str, strategy: str) -> Path:
    script = _migrated() / name
    text = script.read_text()
    assert f'Accelerator(strategy="{strategy}")' in text
    assert "fully_shard(" not in text and "ZeroRedundancyOptimizer(" not in text
    return script


def _launch(name: str, strategy: str) -> list[dict]:
    script = _check_migrated(name, strategy)
    out = script.parent / f"out-{script.stem}"
    out.mkdir()
    accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert accel, "the `accel` console script is not installed"
    cmd = [accel, "launch", "--nproc-per-node", "2", str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _plain_python(scripts: dict[str, str]) -> dict[str, list[dict]]:
    """Run each migrated script as `python script.py OUT`, all in one interpreter (one torch import)."""
    outs = {}
    runs = []
    for name, strategy in scripts.items():
        script = _check_migrated(name, strategy)
        outs[name] = script.parent / f"out-{script.stem}-plain"
        outs[name].mkdir()
        runs.append(f"sys.argv = [{str(script)!r}, {str(outs[name])!r}]; "
                    f"runpy.run_path({str(script)!r}, run_name='__main__')")
    code = "import runpy, sys\n" + "\n".join(runs)
    result = run_cmd([sys.executable, "-c", code], cwd=_migrated(), timeout=TIMEOUT)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return {name: [json.loads((out / "rank0.json").read_text())] for name, out in outs.items()}


def _original(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"hand_sharding_{Path(name).stem}", SCRIPTS / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_process(model: nn.Module, optimizer: torch.optim.Optimizer, data, batch: int) -> tuple[list[float], dict]:
    """Train on batches of `batch` samples in order (2 ranks: both ranks' samples of a step):
    the losses and the final weights."""
    losses = []
    for x, y in torch.utils.data.DataLoader(data, batch_size=batch, shuffle=False):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach().reshape(-1).tolist() for name, p in model.named_parameters()}


def _same_training(ranks: list[dict], losses: list[float], weights: dict) -> None:
    assert [r["world"] for r in ranks] == [len(ranks)] * len(ranks)
    # Each rank's loss is the mean over its share of the step's samples: their mean is the step's loss.
    averaged = [sum(step) / len(ranks) for step in zip(*(r["losses"] for r in ranks))]
    assert averaged == pytest.approx(losses, rel=1e-5, abs=1e-6)
    for rank in ranks:
        trained = {name.removeprefix("module."): values for name, values in rank["weights"].items()}  # DDP's
        assert trained.keys() == weights.keys()
        for name, values in weights.items():
            assert trained[name] == pytest.approx(values, rel=1e-4, abs=1e-5), name


def test_fully_shard_script_trains_like_one_process_and_shards_parameters() -> None:
    ranks = _launch("fsdp_blocks.py", "fsdp")
    original = _original("fsdp_blocks.py")
    torch.manual_seed(0)
    model = original.Net()
    total = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=original.LR)
    losses, weights = _one_process(model, optimizer, original.dataset(), 2 * original.BATCH)
    _same_training(ranks, losses, weights)
    held = [rank["held"] for rank in ranks]
    assert sum(held) == total and max(held) < 0.6 * total, held  # each rank stores about half


def test_zero_redundancy_script_trains_like_one_process_and_shards_optimizer_state() -> None:
    ranks = _launch("zero_adamw.py", "zero1")
    original = _original("zero_adamw.py")
    torch.manual_seed(0)
    model = original.build()
    total = 2 * sum(p.numel() for p in model.parameters())  # AdamW: exp_avg and exp_avg_sq
    optimizer = torch.optim.AdamW(model.parameters(), lr=original.LR, weight_decay=original.WEIGHT_DECAY)
    losses, weights = _one_process(model, optimizer, original.dataset(), 2 * original.BATCH)
    _same_training(ranks, losses, weights)
    state = [rank["state"] for rank in ranks]
    assert sum(state) == total and max(state) < total, state


def test_migrated_scripts_run_as_plain_python() -> None:
    """One process, no launcher: nothing is sharded, and each trains like the plain loop."""
    runs = _plain_python({"fsdp_blocks.py": "fsdp", "zero_adamw.py": "zero1"})
    fsdp = _original("fsdp_blocks.py")
    torch.manual_seed(0)
    model = fsdp.Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=fsdp.LR)
    _same_training(runs["fsdp_blocks.py"], *_one_process(model, optimizer, fsdp.dataset(), fsdp.BATCH))
    zero = _original("zero_adamw.py")
    torch.manual_seed(0)
    model = zero.build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=zero.LR, weight_decay=zero.WEIGHT_DECAY)
    _same_training(runs["zero_adamw.py"], *_one_process(model, optimizer, zero.dataset(), zero.BATCH))
