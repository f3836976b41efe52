"""A checkpoint saved, then its path handed to an evaluation helper of a module the migration cannot
read (cleanrl's `evaluate(model_path, ...)`), then the run uploaded by a helper whose name says so
(`push_to_hub(...)`), on 1 and 2 processes (AM009).

The save runs on the main process; without a barrier the other process would call the helper,
which loads the file, while the main process is still writing it (or before it exists). The
migration puts `accelerator.wait_for_everyone()` before the helper's call and the upload under
`if accelerator.is_main_process:`. The helpers live in a module put on PYTHONPATH (not migrated):
the evaluator records, per rank, the checksum of the weights it loaded; the uploader records
its call. On 2 processes both ranks must load the complete checkpoint (the main process's final
weights) and the upload must happen once; on 1 process the migrated script must print what the
original prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

HELPERS = RECORD_CALLS + '''
import torch


def evaluate(path, episodes):
    state = torch.load(path)
    total = sum(float(v.double().sum()) for v in state.values())
    _record(f"evaluate {total:.10f}")
    return [total] * episodes


def push_to_hub(path, returns):
    _record(f"push {os.path.basename(path)} {len(returns)}")
'''

SCRIPT = '''
import os
import sys

import torch
from torch.utils.data import DataLoader

from rl_helpers import evaluate, push_to_hub


def main(out):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.Linear(256, 4)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4)
    loader = DataLoader(torch.randn(64, 8), batch_size=8)
    for obs in loader:
        obs = obs.to(device)
        loss = model(obs).logsumexp(dim=1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model_path = os.path.join(out, "policy.pt")
    torch.save(model.state_dict(), model_path)
    returns = evaluate(model_path, episodes=3)
    print(f"return {returns[0]:.10f}")
    push_to_hub(model_path, returns)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _run(fakes: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result, recorded_calls(out)


def test_checkpoint_read_by_an_unread_helper_waits_for_the_save(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "rl_helpers.py").write_text(HELPERS)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert "accelerator.wait_for_everyone()\n    returns = evaluate(model_path, episodes=3)" in text, text
    assert "if accelerator.is_main_process:\n        push_to_hub(model_path, returns)" in text, text

    before, calls_before = _run(fakes, original, tmp_path / "original", None)
    one, calls_one = _run(fakes, migrated, tmp_path / "one", None)
    assert one.stdout == before.stdout and calls_one == calls_before, (before.stdout, one.stdout, calls_one)

    _, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert sorted(calls) == ["calls_rank0", "calls_rank1"], calls
    evaluated = {rank: [c for c in lines if c.startswith("evaluate")] for rank, lines in calls.items()}
    assert len(evaluated["calls_rank0"]) == 1 and evaluated["calls_rank0"] == evaluated["calls_rank1"], calls
    assert [c for c in calls["calls_rank0"] if c.startswith("push")] == ["push policy.pt 3"], calls
    assert not [c for c in calls["calls_rank1"] if c.startswith("push")], calls
