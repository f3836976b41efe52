"""`accel-migrate verify`: the comparison logic (pure) and the command on real scripts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from migrate.verify import compare, format_table, verdict_line

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "fixtures" / "scripts"
TIMEOUT = 180

TINY = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=8, shuffle=True)
model = nn.Linear(3, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{extra}
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y){perturb}
        loss.backward()
        optimizer.step()
        print(f"loss {{loss.item():.6f}}")
'''


def _verify(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_COLOR="1")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "migrate", "verify", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )


# -- the comparison -----------------------------------------------------------------------------


def test_compare_identical() -> None:
    result = compare([1.0, 0.5, 0.25], [1.0, 0.5, 0.25], [0, 1, 2])
    assert result.verdict == "identical" and result.ok
    assert "identical" in verdict_line(result, 3)


def test_compare_within_tolerance() -> None:
    result = compare([1.0, 0.5], [1.0, 0.5 * (1 + 1e-7)], [0, 1], rtol=1e-5)
    assert result.verdict == "within tolerance" and result.ok
    assert "largest relative difference 1.00e-07" in verdict_line(result, 2)


def test_compare_diverged_names_the_step() -> None:
    result = compare([1.0, 0.5, 0.25], [1.0, 0.5, 0.3], [0, 1, 2], rtol=1e-5)
    assert result.verdict == "diverged" and not result.ok
    assert result.diverged_at is not None and result.diverged_at.index == 2
    assert verdict_line(result, 3).startswith("verdict: diverged at step 2")
    assert "<- diverged" in format_table(result)


def test_compare_missing_rows_and_nan() -> None:
    assert compare([1.0, 0.5], [1.0], [0, 1]).diverged_at.index == 1  # type: ignore[union-attr]
    assert compare([math.nan], [math.nan]).verdict == "identical"
    assert compare([1.0], [math.nan]).verdict == "diverged"


# -- the command ------------------------------------------------------------------------------


def test_help_says_it_runs_user_code() -> None:
    result = _verify("--help", cwd=ROOT)
    assert result.returncode == 0
    assert "RUNS YOUR SCRIPT" in result.stdout
    assert "verify" in subprocess.run(
        [sys.executable, "-m", "migrate", "--help"], capture_output=True, text=True, timeout=TIMEOUT,
        env=dict(os.environ, NO_COLOR="1"),
    ).stdout


def test_identical_on_a_fixture_script_and_user_file_untouched(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes((SCRIPTS / "train_mlp.py").read_bytes())
    before = (script.read_bytes(), script.stat().st_mtime_ns)
    result = _verify(str(script), "--steps", "3", "--", "--epochs", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "verdict: identical" in result.stdout
    assert "original loss" in result.stdout and "migrated loss" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert rows and max(int(r[1]) for r in rows) == 3  # 3 steps, plus the backward before the 4th
    assert (script.read_bytes(), script.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # nothing written next to it


def test_diverged_exit_1(tmp_path: Path) -> None:
    # the loss depends on whether the file was migrated: diverges at the first step
    script = tmp_path / "train.py"
    script.write_text(
        TINY.format(
            extra="MIGRATED = 'accelerator.' + 'backward' in open(__file__).read()",
            perturb=" + (1e-3 if MIGRATED else 0.0)",
        )
    )
    result = _verify(str(script), "--steps", "2", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "verdict: diverged at step 0" in result.stdout


def test_crash_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TINY.format(extra="raise RuntimeError('boom in the user script')", perturb=""))
    result = _verify(str(script), cwd=tmp_path)
    assert result.returncode == 2
    assert "boom in the user script" in result.stderr and "original script exited" in result.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("import torch\ndef broken(:\n    loss.backward()\n", "cannot be migrated"),  # training code: parsed
        ("import torch\nprint(torch.ones(1))\n", "nothing to migrate"),
    ],
)
def test_not_migratable_exit_2(tmp_path: Path, text: str, message: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(text)
    result = _verify(str(script), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr


VERIFY_SCRIPTS = {
    # script: (args, expected exit code); all of them converge to "identical" on one process,
    # except those the codemod cannot (yet) migrate and the torchrun-only original
    "train_mlp": ([], 0),
    "module_level_loop": ([], 0),
    "argparse_eval_accuracy": ([], 0),
    "gan_two_optimizers": ([], 0),
    "amp_bf16_autocast": ([], 0),
    "manual_accumulation": ([], 0),
    "data_parallel_guarded": ([], 0),
    "checkpoint_resume": ([], 0),
    "clip_warmup_scheduler": ([], 0),
    "no_dataloader_loop": ([], 0),
    "batchnorm_cnn_eval": ([], 0),
}


@pytest.mark.parametrize("name", sorted(VERIFY_SCRIPTS))
def test_verify_fixture_scripts(name: str, tmp_path: Path) -> None:
    args, expected = VERIFY_SCRIPTS[name]
    result = _verify(str(SCRIPTS / f"{name}.py"), "--steps", "5", *(["--", *args] if args else []), cwd=tmp_path)
    assert result.returncode == expected, result.stdout + result.stderr
    assert "verdict: identical" in result.stdout


def test_verify_torchrun_original_needs_torchrun(tmp_path: Path) -> None:
    # a hand-written torchrun script cannot run as `python script.py` (no RANK/LOCAL_RANK), so the
    # original run fails and verify says so with exit 2; compare it under torchrun (the e2e harness)
    result = _verify(str(SCRIPTS / "torchrun_ddp.py"), "--steps", "3", cwd=tmp_path)
    assert result.returncode == 2
    assert "the original script exited" in result.stderr
