"""A writer the script itself builds on the main process only and passes on (AM012 leaves it alone).

The script creates its `SummaryWriter` under `if rank == 0:` (else `None`), with the rank from
`torch.distributed`, and hands it to its training function, which writes under `if writer is not
None:`: the shape of many research repositories' `main.py`. The migration must leave the writer as
it is, with no diagnostic (it used to report it as running on every process, making the file
partial). tensorboardX is a fake that records each call with the rank that made it. On one process
the migrated script makes the original's calls and ends with the original's weights; on 2
processes only rank 0 creates and writes the log, and both ranks end with the same weights.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, ROOT, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

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
import os
import sys

import torch
import torch.distributed as dist
from tensorboardX import SummaryWriter
from torch.utils.data import DataLoader, TensorDataset


def train_one_epoch(model, loader, optimizer, epoch, writer=None):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if writer is not None:
        writer.add_scalar("loss", loss.item(), epoch)


def main(out):
    torch.manual_seed(0)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0 and out is not None:
        writer = SummaryWriter(os.path.join(out, "runs"))
    else:
        writer = None
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=4)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        train_one_epoch(model, loader, optimizer, epoch, writer=writer)
    if writer is not None:
        writer.close()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    with open(os.path.join(out, f"weights{os.environ.get('RANK', '0')}.txt"), "w") as f:
        f.write(" ".join(f"{v:.6f}" for v in weights.tolist()))


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _run(fakes: Path, script: Path, out: Path, nproc: int | None) -> dict[str, list[str]]:
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return recorded_calls(out)


def test_writer_built_on_main_process_is_left_alone(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "tensorboardX.py").write_text(FAKE_TENSORBOARDX)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    check = subprocess.run(
        [sys.executable, "-m", "migrate", "--diff", str(original)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    report = check.stdout + check.stderr
    assert "0 diagnostics" in report and "Outcomes: 1 migrated." in report, report
    text = migrated.read_text()
    assert "accelerator.prepare(model, optimizer, loader)" in text, text
    assert "    if rank == 0 and out is not None:\n        writer = SummaryWriter(" in text, text

    expected = ["SummaryWriter", "add_scalar loss 0", "add_scalar loss 1", "close"]
    single = _run(fakes, original, tmp_path / "original", None)
    assert single == {"calls_rank0": expected}
    assert _run(fakes, migrated, tmp_path / "one", None) == single
    assert (tmp_path / "one" / "weights0.txt").read_text() == (tmp_path / "original" / "weights0.txt").read_text()

    two = _run(fakes, migrated, tmp_path / "two", 2)
    assert two == {"calls_rank0": expected}, "rank 1 logged too" if "calls_rank1" in two else two
    assert (tmp_path / "two" / "weights0.txt").read_text() == (tmp_path / "two" / "weights1.txt").read_text()
