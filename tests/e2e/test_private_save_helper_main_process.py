"""A private saving helper the migration cannot read (`from ckptlib import _save_checkpoint`), known
by its name like `save_checkpoint` (AM009): migrated, it runs on the main process only and is handed
the user's module. The helper is a fake on PYTHONPATH that records the rank calling it and the type
of model it got. On 1 process the migrated script makes the original's calls; on 2 processes only
rank 0 saves, each time with the plain `nn.Linear`, and both ranks finish.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_CKPTLIB = RECORD_CALLS + '''
import torch


def _save_checkpoint(model, optimizer, epoch, out, is_best=False):
    _record(f"save {epoch} {type(model).__name__}")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
               os.path.join(out, f"ckpt{epoch}.pth"))
'''

SCRIPT = '''
import sys

import torch
from ckptlib import _save_checkpoint
from torch.utils.data import DataLoader, TensorDataset


def main(out):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = DataLoader(data, batch_size=4)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _save_checkpoint(model, optimizer, epoch, out, is_best=True)


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


def test_private_save_helper_runs_on_the_main_process(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "ckptlib.py").write_text(FAKE_CKPTLIB)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert (
        "if accelerator.is_main_process:\n"
        "            _save_checkpoint(accelerator.unwrap_model(model), optimizer, epoch, out, is_best=True)"
    ) in text, text

    expected = ["save 0 Linear", "save 1 Linear"]
    assert _run(fakes, original, tmp_path / "original", None) == {"calls_rank0": expected}
    assert _run(fakes, migrated, tmp_path / "one", None) == {"calls_rank0": expected}
    two = _run(fakes, migrated, tmp_path / "two", 2)
    assert two == {"calls_rank0": expected}, "rank 1 saved too" if "calls_rank1" in two else two
