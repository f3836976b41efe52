"""wandb started only when a flag asks for it (`if args.track: import wandb; wandb.init(...)`), in a
Python without wandb: the migrated script must run where the original runs (AM012).

Converted to the tracker API, the Accelerator would be created with `log_with="wandb"` on every
run, and fail to start where wandb is not installed, though the original imports it only under the
flag. The rule guards such a conditional `wandb.init` instead. Without the flag, the migrated script
prints the original's losses on one process and trains on two; with the flag and a fake wandb
module on PYTHONPATH (recording each call with its rank), only rank 0 starts the run and logs.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import argparse

import torch
from torch.utils.data import DataLoader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--track", action="store_true")
    args = parser.parse_args()
    if args.track:
        import wandb

        wandb.init(project="flagged", config=vars(args))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(16, 3), batch_size=4)
    for epoch in range(2):
        for x in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.track:
                wandb.log({"loss": loss.item()})
        print(f"epoch {epoch} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
'''

FAKE_WANDB = RECORD_CALLS + '''
_started = False


def init(**kwargs):
    global _started
    _record("wandb.init " + kwargs["project"])
    _started = True


def log(values, step=None):
    if not _started:
        raise RuntimeError("You must call wandb.init() before wandb.log()")
    _record("wandb.log " + ",".join(sorted(values)))
'''


def _run(script: Path, out: Path, nproc: int | None, *args: str, pythonpath: Path | None = None):
    out.mkdir()
    env = ["env", f"LOG_CALLS_DIR={out}"] + ([f"PYTHONPATH={pythonpath}"] if pythonpath else [])
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), *args]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.skipif(find_spec("wandb") is not None, reason="needs a Python where wandb is not installed")
def test_conditional_wandb_runs_without_wandb_and_on_the_main_process(tmp_path: Path) -> None:
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert "log_with" not in text, text
    assert "if accelerator.is_main_process:\n            wandb.init(" in text, text

    # no flag, no wandb: the original runs, and so must the migrated script, with the same losses
    before = _run(original, tmp_path / "original", None)
    one = _run(migrated, tmp_path / "one", None)
    assert one.stdout == before.stdout and "epoch 1 loss" in before.stdout, (before.stdout, one.stdout)
    two = _run(migrated, tmp_path / "two", 2)
    assert two.stdout.count("epoch 1 loss") == 1, two.stdout

    # with the flag and a wandb on the path: the run is started, and written to, by rank 0 only
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "wandb.py").write_text(FAKE_WANDB)
    _run(migrated, tmp_path / "tracked", 2, "--track", pythonpath=fakes)
    calls = recorded_calls(tmp_path / "tracked")
    assert list(calls) == ["calls_rank0"], calls
    assert calls["calls_rank0"][0] == "wandb.init flagged", calls
    assert calls["calls_rank0"].count("wandb.log loss") == 4, calls  # 2 epochs of 2 batches each
