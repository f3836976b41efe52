"""AM012 across modules: a logger class of another module (SummaryWriter created in its
`__init__`, written in its methods) whose instances are built only under a main-process check in
the script (`if rank == 0 and args.log_dir:`, convnext's `TensorboardLogger` shape) logs on the
main process only: nothing is reported or guarded. Built anywhere else (outside such a check, or
in its `else`), its logging, which cannot reach the accelerator, is still reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from migrate.engine import Options
from migrate.runner import run

_UTILS = '''import torch
from torch.utils.tensorboard import SummaryWriter


class BoardLogger:
    def __init__(self, log_dir):
        self.writer = SummaryWriter(log_dir=log_dir)
        self.step = 0

    def update(self, **values):
        for key, value in values.items():
            self.writer.add_scalar(key, value, self.step)
        self.step += 1

    def flush(self):
        self.writer.flush()
'''

_ENGINE = '''import torch


def train_one_epoch(model, optimizer, loader, board):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if board is not None:
            board.update(loss=loss.item())
'''

_MAIN = '''import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

{imports}
from engine import train_one_epoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args()
    rank = dist.get_rank() if dist.is_initialized() else 0
{creation}
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    for epoch in range(2):
        train_one_epoch(model, optimizer, loader, board)
    if board is not None:
        board.flush()


if __name__ == "__main__":
    main()
'''

_GUARDED = '''    if rank == 0 and args.log_dir is not None:
        board = {cls}(args.log_dir)
    else:
        board = None'''


def _run(tmp_path: Path, imports: str, creation: str) -> dict[str, object]:
    (tmp_path / "utils.py").write_text(_UTILS)
    (tmp_path / "engine.py").write_text(_ENGINE)
    (tmp_path / "main.py").write_text(_MAIN.format(imports=imports, creation=creation))
    report = run([tmp_path], Options(), write=False)
    return {Path(r.path).name: r for r in report.results}


def _am012(results: dict[str, object]) -> list[object]:
    return [d for r in results.values() for d in r.diagnostics if d.code == "AM012"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("imports", "creation"), [
    ("import utils", _GUARDED.format(cls="utils.BoardLogger")),
    ("from utils import BoardLogger", _GUARDED.format(cls="BoardLogger")),
    ("import utils", "    if rank != 0:\n        board = None\n    else:\n        board = utils.BoardLogger(args.log_dir)"),
    ("import utils", "    board = None\n    if not (rank != 0 or args.log_dir is None):\n"
                     "        board = utils.BoardLogger(args.log_dir)"),
])
def test_a_logger_class_built_on_the_main_process_only_is_neither_reported_nor_guarded(
    tmp_path: Path, imports: str, creation: str,
) -> None:
    results = _run(tmp_path, imports, creation)
    assert _am012(results) == []
    assert not results["utils.py"].changed  # type: ignore[attr-defined]
    assert results["main.py"].changed  # type: ignore[attr-defined]
    assert "accelerator.backward(loss)" in (results["engine.py"].new_text or "")  # type: ignore[attr-defined]


@pytest.mark.parametrize("creation", [
    "    board = utils.BoardLogger(args.log_dir)",  # on every process
    "    if rank == 0:\n        board = None\n    else:\n        board = utils.BoardLogger(args.log_dir)",
    "    if rank == 0:\n        board = utils.BoardLogger(args.log_dir)\n    else:\n        board = None\n"
    "    extra = utils.BoardLogger",  # the class passed on: it may be built anywhere
])
def test_a_logger_class_built_elsewhere_is_still_reported(tmp_path: Path, creation: str) -> None:
    results = _run(tmp_path, "import utils", creation)
    lines = sorted(d.line for d in _am012(results))  # type: ignore[attr-defined]
    assert lines == [7, 12, 16]
    assert all("cannot reach the accelerator" in d.message for d in _am012(results))  # type: ignore[attr-defined]
