"""Functions and a logger class the migration cannot read, known by their names, on 2 processes (AM009, AM012).

The script imports its helpers from a module the migration does not have (a fake written by the
test into a folder put on PYTHONPATH only when the script runs): `fetch_weights(models_dir=...)`
downloads when its files are missing and returns what it loaded (its result used),
`save_config_file(...)`, `save_checkpoint(state, model, filename=...)` and `progress_bar(...)`
write files or draw a bar. Each records the rank that called it. Launched as it is on 2
processes, both ranks download into the same folder, save, and draw the bar. Migrated with the CLI
and launched with `accel launch --nproc-per-node 2`: rank 0 downloads (rank 1 then finds the files
and loads them, under `main_process_first()`), and only rank 0 saves the config, the checkpoints
(handed the user's module, not the DistributedDataParallel around it) and draws the bar; both
ranks train and finish.

A `Logger` class of the project (a fake that opens an event file when built), imported in a method
from a module the migration does not have and written to from the training method, is built and
written on every process as it is (two event files); migrated, only rank 0 builds it and writes.
So is a SummaryWriter kept as `self.writer` whose `log_dir` is read only by statements that run
on the main process (the config and checkpoint saved into it, the log file's setup, a log line).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_HELPERS = RECORD_CALLS + '''
import time

import torch


def fetch_weights(models_dir):
    marker = os.path.join(models_dir, "done")
    if not os.path.exists(marker):
        _record("download")
        os.makedirs(models_dir, exist_ok=True)
        torch.save(torch.full((1, 4), 0.5), os.path.join(models_dir, "weights.pt"))
        time.sleep(1.0)
        with open(marker, "w") as f:
            f.write("ok")
    else:
        _record("found")
    return torch.load(os.path.join(models_dir, "weights.pt"))


def save_config_file(folder, config):
    _record("config")
    with open(os.path.join(folder, "config.txt"), "w") as f:
        f.write(repr(config))


def save_checkpoint(state, model, filename):
    _record(f"save {type(model).__name__}")
    torch.save(state, filename)


def progress_bar(current, total, message):
    _record("progress")
'''

SCRIPT = """
import sys

import torch
from torch.utils.data import DataLoader
from train_helpers import fetch_weights, progress_bar, save_checkpoint, save_config_file


def main(out):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    weights = fetch_weights(models_dir=out + "/weights")
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.copy_(weights)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(16, 4), batch_size=4)
    save_config_file(out, {"lr": 0.1})
    for epoch in range(2):
        for i, x in enumerate(loader):
            x = x.to(device)
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            progress_bar(i, len(loader), "loss %.3f" % loss.item())
        save_checkpoint({"epoch": epoch, "state_dict": model.state_dict()}, model,
                        filename=out + "/last.pt")
    print("done", loss.item())


if __name__ == "__main__":
    main(sys.argv[1])
"""


def _run(fakes: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    return run_cmd([*env, *launch, str(script), str(out)], cwd=out, timeout=TIMEOUT), recorded_calls(out)


def test_helpers_known_by_name_run_on_the_main_process(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "train_helpers.py").write_text(FAKE_HELPERS)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert ("    with accelerator.main_process_first():\n"
            "        weights = fetch_weights(models_dir=out + \"/weights\")\n") in text, text
    assert "accelerator.unwrap_model(model)" in text, text

    # The original on 2 processes: both ranks save and draw the bar (and may both download).
    result, calls = _run(fakes, original, tmp_path / "original", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "config" in calls["calls_rank1"] and "progress" in calls["calls_rank1"], calls

    # Migrated, on 1 process: as the original on 1 process.
    result, calls = _run(fakes, migrated, tmp_path / "one", None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["download", "config", *["progress"] * 4, "save Linear", *["progress"] * 4,
                                     "save Linear"]}, calls
    assert (tmp_path / "one" / "last.pt").exists()

    # Migrated, on 2 processes: rank 0 downloads and writes; rank 1 only loads what it found.
    result, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls["calls_rank1"] == ["found"], calls
    assert calls["calls_rank0"] == ["download", "config", *["progress"] * 2, "save Linear", *["progress"] * 2,
                                    "save Linear"], calls
    assert result.stdout.count("done") == 1, result.stdout


FAKE_LOGGER = RECORD_CALLS + '''

class Logger:
    """A TensorBoard logger of the project: on creation it would open an event file in log_dir."""

    def __init__(self, log_dir):
        _record("logger created")
        os.makedirs(log_dir, exist_ok=True)
        open(os.path.join(log_dir, f"events.{os.getpid()}"), "w").close()

    def scalar_summary(self, tag, value, step):
        _record(f"scalar {tag} {step}")
'''

LOGGER_SCRIPT = """
import sys

import torch
from torch.utils.data import DataLoader


class Solver:
    def __init__(self, loader, log_dir):
        self.loader = loader
        self.log_dir = log_dir
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.build_tensorboard()

    def build_tensorboard(self):
        from tb_logger import Logger
        self.logger = Logger(self.log_dir)

    def train(self):
        for i, x in enumerate(self.loader):
            loss = self.model(x).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.logger.scalar_summary("loss", loss.item(), i + 1)
        print("done", loss.item())


if __name__ == "__main__":
    torch.manual_seed(0)
    Solver(DataLoader(torch.randn(16, 4), batch_size=4), sys.argv[1] + "/logs").train()
"""


def test_a_logger_class_it_cannot_read_is_built_and_written_on_the_main_process(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "tb_logger.py").write_text(FAKE_LOGGER)
    original, migrated = migrated_script(tmp_path, LOGGER_SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert ("        if self.accelerator.is_main_process:\n"
            "            self.logger = Logger(self.log_dir)\n") in text, text

    # The original on 2 processes: two event files, each rank logging its own losses.
    result, calls = _run(fakes, original, tmp_path / "original", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls["calls_rank1"][0] == "logger created", calls
    assert len(list((tmp_path / "original" / "logs").iterdir())) == 2

    result, calls = _run(fakes, migrated, tmp_path / "one", None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["logger created", *[f"scalar loss {i}" for i in range(1, 5)]]}, calls

    # Migrated, on 2 processes: one event file; rank 1 neither builds the logger nor writes.
    result, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["logger created", "scalar loss 1", "scalar loss 2"]}, calls
    assert len(list((tmp_path / "two" / "logs").iterdir())) == 1
    assert result.stdout.count("done") == 1, result.stdout


FAKE_TENSORBOARDX = RECORD_CALLS + '''

class SummaryWriter:
    """Opens an event file in a folder of its own when built, as tensorboardX does."""

    def __init__(self, log_dir=None):
        _record("SummaryWriter")
        self.log_dir = log_dir or os.path.join(os.environ["LOG_CALLS_DIR"], "runs", str(os.getpid()))
        os.makedirs(self.log_dir, exist_ok=True)
        open(os.path.join(self.log_dir, "events"), "w").close()

    def add_scalar(self, tag, value, global_step=None):
        _record(f"add_scalar {tag} {global_step}")
'''

WRITER_SCRIPT = """
import logging
import os
import sys

import torch
from torch.utils.data import DataLoader
from tensorboardX import SummaryWriter
from train_helpers import save_checkpoint, save_config_file


class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.writer = SummaryWriter()
        logging.basicConfig(filename=os.path.join(self.writer.log_dir, "train.log"), level=logging.INFO)

    def fit(self, loader):
        save_config_file(self.writer.log_dir, {"lr": 0.1})
        for step, x in enumerate(loader):
            loss = self.model(x).pow(2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            self.writer.add_scalar("loss", loss.item(), global_step=step)
        save_checkpoint({"state_dict": self.model.state_dict()}, self.model,
                        filename=os.path.join(self.writer.log_dir, "last.pt"))
        logging.info(f"saved in {self.writer.log_dir}")
        print("done", loss.item())


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(16, 4), batch_size=4)
    trainer = Trainer(model, optimizer)
    trainer.fit(loader)


if __name__ == "__main__":
    main()
"""


def test_a_writer_read_by_main_process_statements_is_built_on_the_main_process(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    (fakes / "tensorboardX").mkdir(parents=True)
    (fakes / "tensorboardX" / "__init__.py").write_text(FAKE_TENSORBOARDX)
    (fakes / "train_helpers.py").write_text(FAKE_HELPERS)
    original, migrated = migrated_script(tmp_path, WRITER_SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert ("        if self.accelerator.is_main_process:\n"
            "            self.writer = SummaryWriter()\n") in text, text

    # The original on 2 processes: two writers, two event folders, both ranks save.
    result, calls = _run(fakes, original, tmp_path / "original", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls["calls_rank1"][:2] == ["SummaryWriter", "config"], calls
    assert len(list((tmp_path / "original" / "runs").iterdir())) == 2

    # Migrated, on 2 processes: rank 0 alone builds the writer, writes through it and saves into
    # its folder; rank 1 trains its half and finishes.
    result, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["SummaryWriter", "config", "add_scalar loss 0", "add_scalar loss 1",
                                     "save Linear"]}, calls
    (folder,) = (tmp_path / "two" / "runs").iterdir()
    assert (folder / "last.pt").exists() and "saved in" in (folder / "train.log").read_text()
    assert result.stdout.count("done") == 1, result.stdout
