"""A Ctrl-C save in the `__main__` block of a script whose Accelerator is created inside the
function that trains (AM009, AM012 where no Accelerator is in scope).

The `__main__` block sets up console logging, builds the model, calls `fit(model=net, ...)` in a
`try:` and, in `except KeyboardInterrupt:`, saves `net.state_dict()` to INTERRUPTED.pth, logs a
line and calls `sys.exit(0)`. The training raises KeyboardInterrupt itself at a fixed step, on
every process (as a launcher's Ctrl-C reaches every worker). The migration runs the save and the
logging setup on the launcher's rank 0 (`RANK`). A `sitecustomize` put first on PYTHONPATH records
each `torch.save` call with the rank that made it. On 1 process the migrated script saves what the
original saves (the same keys and tensors); on 2 processes under `accel launch` only rank 0 saves,
once, the user's keys (no `module.` prefix), both processes exit 0, and the log line is printed once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

# Records every torch.save with the process's launcher rank (imported at start-up by `site`).
SITECUSTOMIZE = '''
import os


def _install():
    import torch

    original = torch.save

    def save(obj, f, *args, **kwargs):
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(os.environ["LOG_CALLS_DIR"], f"calls_rank{rank}.txt"), "a") as log:
            log.write(f"save {os.path.basename(str(f))}\\n")
        return original(obj, f, *args, **kwargs)

    torch.save = save


if os.environ.get("LOG_CALLS_DIR"):
    _install()
'''

SCRIPT = '''
import logging
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class Segmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Conv2d(3, 4, 3, padding=1)
        self.decode = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        return self.decode(torch.relu(self.encode(x)))


def fit(model, device, epochs=3, lr=0.05, stop_at=5):
    images = torch.randn(32, 3, 6, 6)
    masks = (torch.rand(32, 1, 6, 6) > 0.5).float()
    loader = DataLoader(TensorDataset(images, masks), batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.BCEWithLogitsLoss()
    step = 0
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step == stop_at:
                raise KeyboardInterrupt  # as if Ctrl-C came here
        logging.info("epoch %d loss %.4f", epoch, loss.item())


if __name__ == "__main__":
    torch.manual_seed(0)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = Segmenter()
    net.to(device=device)
    try:
        fit(model=net, device=device)
    except KeyboardInterrupt:
        torch.save(net.state_dict(), "INTERRUPTED.pth")
        logging.info("Saved interrupt")
        sys.exit(0)
'''

KEYS = ["encode.weight", "encode.bias", "decode.weight", "decode.bias"]


def _run(fakes: Path, script: Path, out: Path, nproc: int | None) -> tuple[dict[str, list[str]], str]:
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return recorded_calls(out), result.stdout + result.stderr


def test_interrupt_save_runs_once_with_the_users_keys(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "sitecustomize.py").write_text(SITECUSTOMIZE)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert 'if int(environ.get("RANK", "0")) == 0:\n            torch.save(net.state_dict(), "INTERRUPTED.pth")' \
        in text, text
    assert 'if int(environ.get("RANK", "0")) == 0:\n        logging.basicConfig(' in text, text
    assert "accelerator.prepare(" in text and "accelerator.backward(loss)" in text, text

    single, single_log = _run(fakes, original, tmp_path / "original", None)
    assert single == {"calls_rank0": ["save INTERRUPTED.pth"]}
    expected = torch.load(tmp_path / "original" / "INTERRUPTED.pth")
    assert list(expected) == KEYS

    one, one_log = _run(fakes, migrated, tmp_path / "one", None)
    assert one == single
    saved = torch.load(tmp_path / "one" / "INTERRUPTED.pth")
    assert list(saved) == KEYS
    assert all(torch.equal(saved[k], expected[k]) for k in KEYS)
    assert one_log.count("INFO: Saved interrupt") == single_log.count("INFO: Saved interrupt") == 1

    two, two_log = _run(fakes, migrated, tmp_path / "two", 2)
    assert two == {"calls_rank0": ["save INTERRUPTED.pth"]}, "rank 1 saved too" if "calls_rank1" in two else two
    saved = torch.load(tmp_path / "two" / "INTERRUPTED.pth")
    assert list(saved) == KEYS  # the user's module: no `module.` prefix
    assert not any(torch.equal(saved[k], expected[k]) for k in ("encode.weight", "decode.weight"))  # trained on halves
    assert two_log.count("INFO: Saved interrupt") == 1, two_log  # logging set up on rank 0 only
