"""`accel-migrate verify`: the comparison logic (pure) and the command on real scripts, on one
process and with `--nproc-per-node 2` (real gloo processes under torch.distributed.run: a correct
migration passes; a migrated script whose rank 1 drifts, skips a step, crashes or hangs is reported
with the rank named). Every run is bounded: verify's own --timeout, and a subprocess timeout."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from migrate.verify import (
    Run,
    compare,
    format_table,
    replica_report,
    stack_location,
    step_mismatch,
    torchrun_exit_codes,
    verdict_line,
)

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
    "nanogpt_style_ddp": ([], 0),  # DDP only when torchrun's RANK is set: plain python runs it alone
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


# -- N processes: the pure parts -----------------------------------------------------------------


def _run(records: dict[int, list[int]], weights: dict[int, dict[str, str]]) -> Run:
    """A Run whose rank r recorded a backward call at each optimizer step of records[r] and ended
    with parameters hashed as weights[r] (name -> sha)."""
    run = Run(0, "", "")
    for rank, steps in records.items():
        run.records[rank] = [{"index": i, "step": s, "loss": 1.0} for i, s in enumerate(steps)]
        run.ends[rank] = {"end": True, "steps": max(steps) + 1, "weights": [
            {"name": n, "shape": [1], "sha": sha} for n, sha in weights[rank].items()
        ]}
    return run


def test_replica_report_names_the_rank_and_tensors() -> None:
    same = {"fc.weight": "a", "fc.bias": "b"}
    lines, in_sync = replica_report(_run({0: [0, 1], 1: [0, 1]}, {0: same, 1: dict(same)}), 2)
    assert in_sync and lines[0].startswith("replicas: in sync (all 2 parameter tensors")
    lines, in_sync = replica_report(_run({0: [0, 1], 1: [0, 1]}, {0: same, 1: {"fc.weight": "a", "fc.bias": "c"}}), 2)
    assert not in_sync and lines == ["replicas: rank 1's final weights differ from rank 0's in 1 of 2 tensors: fc.bias"]


def test_step_mismatch_names_the_rank_that_skipped() -> None:
    w = {0: {"p": "a"}, 1: {"p": "a"}}
    assert step_mismatch(_run({0: [0, 1, 2], 1: [0, 1, 2]}, w), 2) == ""
    message = step_mismatch(_run({0: [0, 1, 2], 1: [0, 1, 1]}, w), 2)
    assert message.startswith("rank 1 made backward call #2 at optimizer step 1, rank 0 at step 2")


def test_torchrun_failure_summary_and_stack_location(tmp_path: Path) -> None:
    summary = (
        "[1]:\n  time      : x\n  host      : localhost\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -15 (pid: 7695)\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 7696)\n"
    )
    assert torchrun_exit_codes(summary) == {0: -15, 1: 3}
    script = tmp_path / "train.py"
    stack = (
        "Timeout (0:00:15)!\nThread 0x00007f01 (most recent call first):\n  File \"/usr/lib/threading.py\", line 5 in run\n"
        f"Thread 0x00007f00 (most recent call first):\n  File \"/x/torch/autograd/graph.py\", line 9 in run_backward\n"
        f"  File \"{script}\", line 29 in <module>\n  File \"<frozen runpy>\", line 88 in _run_code\n"
    )
    assert stack_location(stack, script) == "train.py:29 in <module>"


# -- N processes: the command ----------------------------------------------------------------------

# A training loop whose migrated copy misbehaves on rank 1 only, as chosen by its first argument
# (the original runs on one process, where RANK is unset: it never takes a faulty branch).
FAULTY = '''
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

RANK = int(os.environ.get("RANK", "0"))
FAULT = sys.argv[1] if len(sys.argv) > 1 else ""
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=8, shuffle=True)
model = nn.Linear(3, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
for epoch in range(2):
    for i, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        if FAULT == "crash" and RANK == 1 and i == 2:
            raise RuntimeError("rank 1 fails here")
        if FAULT == "hang" and RANK == 1 and i == 2:
            time.sleep(3600)  # the hang
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if not (FAULT == "skip" and RANK == 1 and i == 2):
            optimizer.step()
        if not (FAULT == "drift" and RANK == 1):
            scheduler.step()
        print(f"loss {loss.item():.6f}")
'''


def _faulty(tmp_path: Path, fault: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(FAULTY)
    return _verify(str(script), "--nproc-per-node", "2", "--timeout", "60", *options, "--", fault, cwd=tmp_path)


def test_two_processes_correct_migration_passes(tmp_path: Path) -> None:
    result = _faulty(tmp_path, "none", "--steps", "4")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "on 2 processes (torch.distributed.run, gloo, CPU, split_batches)" in result.stdout
    assert re.search(r"verdict: (identical|within tolerance) \(5 losses", result.stdout), result.stdout
    assert "replicas: in sync (all 2 parameter tensors bit-identical on ranks 0-1 after 4 optimizer steps)" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 5
    for row in rows:  # index, step, original, mean, abs, rel, rank 0, rank 1
        assert abs((float(row[6]) + float(row[7])) / 2 - float(row[3])) <= 1e-6 * abs(float(row[3]))
        assert float(row[6]) != float(row[7])  # the ranks saw different halves of the batch


def test_two_processes_drifting_rank_is_named(tmp_path: Path) -> None:
    # rank 1 never steps its LR scheduler: same averaged gradients, another learning rate
    result = _faulty(tmp_path, "drift", "--steps", "4")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "replicas: rank 1's final weights differ from rank 0's in 2 of 2 tensors: weight, bias" in result.stdout
    assert "verdict: diverged at step 2" in result.stdout  # the first step taken with another LR shows at step 2


def test_two_processes_skipped_step_is_named(tmp_path: Path) -> None:
    result = _faulty(tmp_path, "skip", "--steps", "0")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ranks: rank 1 made backward call #3 at optimizer step 2, rank 0 at step 3" in result.stdout
    assert "replicas: rank 1's final weights differ from rank 0's" in result.stdout


def test_two_processes_crash_names_the_rank(tmp_path: Path) -> None:
    result = _faulty(tmp_path, "crash", "--steps", "6")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "crash: rank 1 first" in result.stderr
    assert re.search(r"rank 1: crashed at train\.py:\d+ in <module>: RuntimeError: rank 1 fails here", result.stderr)
    assert "rank 1 traceback:" in result.stderr


def test_two_processes_hang_names_the_rank_and_line(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    script = tmp_path / "train.py"
    script.write_text(FAULTY)
    result = _verify(
        # 40 s: on a loaded machine rank 0 must reach the collective it then waits in before its own
        # deadline, or it too reads as not waiting (it was still starting)
        str(script), "--nproc-per-node", "2", "--timeout", "40", "--steps", "6", "--keep", str(keep), "--", "hang",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "hang: rank 1 stopped making progress; the other ranks waited for it" in result.stderr
    line = re.search(r"rank 1: hung: still running after 40 s, at train\.py:(\d+) in <module>", result.stderr)
    assert line, result.stderr
    migrated = (keep / "migrated" / "train.py").read_text().splitlines()
    assert "time.sleep(3600)" in migrated[int(line.group(1)) - 1]


def test_two_processes_need_the_runtime_target(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(FAULTY)
    result = _verify(str(script), "--nproc-per-node", "2", "--target", "accelerate", cwd=tmp_path)
    assert result.returncode != 0 and "needs --target runtime" in result.stderr


@pytest.mark.parametrize("name", ["train_mlp", "manual_accumulation"])
def test_two_processes_fixture_scripts(name: str, tmp_path: Path) -> None:
    result = _verify(str(SCRIPTS / f"{name}.py"), "--steps", "5", "--nproc-per-node", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"verdict: (identical|within tolerance)", result.stdout)
    assert "replicas: in sync" in result.stdout


def test_two_processes_explicit_split_batches_false_is_explained(tmp_path: Path) -> None:
    # a half-migrated script whose own Accelerator(split_batches=False) overrides verify's
    # ACCEL_SPLIT_BATCHES=1: each rank loads whole batches, so the losses diverge, and verify says why
    script = tmp_path / "train.py"
    script.write_text(
        TINY.format(extra="", perturb="")
        .replace("import torch\n", "import torch\nfrom runtime import Accelerator\n", 1)
        .replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\naccelerator = Accelerator(split_batches=False)\n", 1)
    )
    result = _verify(str(script), "--steps", "2", "--nproc-per-node", "2", "--timeout", "60", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "has split_batches=False (given explicitly?)" in result.stdout
    assert "verdict: diverged at step 0" in result.stdout
