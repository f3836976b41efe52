"""Experiment logging on 2 processes: only the main process creates and writes the logs (AM012).

A training script logs through a TensorBoard-style `SummaryWriter` (`tensorboardX`, its directory
computed: guarded), wandb (`init` / `log` / `finish`: converted to the tracker API, which the
runtime's wandb tracker runs through the fake's run object) and `logging.basicConfig(filename=...)`
+ `logger.info`, then saves its checkpoint and loads it back (AM009 puts a barrier between). Neither tensorboardX nor wandb is
installed here: fake modules of the same names, put on PYTHONPATH by the test, record each call
with the rank that made it (and `wandb.log` refuses to run before `wandb.init`, like wandb does).
The script is migrated with the CLI and launched with `accel launch --nproc-per-node 2`: rank 0
must have made every call, rank 1 none, and the log file must hold each line once. On one process
the migrated script must make exactly the calls the original makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_WANDB = RECORD_CALLS + '''
_run = None


class Run:
    class config:
        @staticmethod
        def update(values, allow_val_change=False):
            _record("wandb.config " + ",".join(sorted(values)))

    def log(self, values, step=None):
        log(values, step)

    def finish(self):
        finish()


def init(**kwargs):
    global _run
    _record("wandb.init " + kwargs["project"])
    _run = Run()
    return _run


def log(values, step=None):
    if _run is None:
        raise RuntimeError("You must call wandb.init() before wandb.log()")
    _record("wandb.log " + ",".join(sorted(values)))


def finish():
    _record("wandb.finish")
'''

FAKE_TENSORBOARDX = RECORD_CALLS + '''

class SummaryWriter:
    def __init__(self, logdir=None):
        _record("SummaryWriter")

    def add_scalar(self, tag, value, step):
        _record(f"add_scalar {tag} {step}")

    def close(self):
        _record("close")
'''

SCRIPT = '''
import logging
import os
import sys

import torch
import wandb
from tensorboardX import SummaryWriter
from torch.utils.data import DataLoader


def main(out):
    logging.basicConfig(filename=os.path.join(out, "train.log"), level=logging.INFO)
    logger = logging.getLogger("train")
    torch.manual_seed(0)
    wandb.init(project="e2e")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(32, 4), batch_size=4)
    writer = SummaryWriter(os.path.join(out, "runs"))
    epoch_step = 0
    for epoch in range(2):
        for x in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        writer.add_scalar("loss", loss.item(), epoch)
        wandb.log({"epoch": epoch})
        logger.info("epoch %d done", epoch)
    writer.close()
    wandb.finish()
    torch.save(model.state_dict(), os.path.join(out, "model.pth"))
    model.load_state_dict(torch.load(os.path.join(out, "model.pth")))


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "wandb.py").write_text(FAKE_WANDB)
    (fakes / "tensorboardX.py").write_text(FAKE_TENSORBOARDX)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    return fakes, original, migrated


def _run(fakes: Path, script: Path, out: Path, nproc: int | None) -> dict[str, list[str]]:
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return recorded_calls(out)


def test_logging_runs_on_the_main_process_only(tmp_path: Path) -> None:
    fakes, original, migrated = _setup(tmp_path)
    text = migrated.read_text()
    assert "if accelerator.is_main_process:\n        writer = SummaryWriter(" in text, text
    assert "accelerator.wait_for_everyone()" in text, text
    # wandb's init/log/finish are converted to the tracker API (the runtime's wandb tracker calls
    # the fake's run); the writer's directory is computed, so it is guarded instead.
    assert 'Accelerator(log_with="wandb")' in text and 'accelerator.init_trackers("e2e")' in text, text
    assert "wandb" not in text.replace('"wandb"', ""), text

    expected = [
        "wandb.init e2e", "SummaryWriter",
        "add_scalar loss 0", "wandb.log epoch",
        "add_scalar loss 1", "wandb.log epoch",
        "close", "wandb.finish",
    ]
    single = _run(fakes, original, tmp_path / "original", None)
    assert single == {"calls_rank0": expected}
    assert _run(fakes, migrated, tmp_path / "one", None) == single
    assert (tmp_path / "one" / "train.log").read_text() == (tmp_path / "original" / "train.log").read_text()

    two = _run(fakes, migrated, tmp_path / "two", 2)
    assert two == {"calls_rank0": expected}, "rank 1 logged too" if "calls_rank1" in two else two
    lines = (tmp_path / "two" / "train.log").read_text().splitlines()
    assert lines == ["INFO:train:epoch 0 done", "INFO:train:epoch 1 done"], lines
