"""Whole-module snapshots, their cleanup, a cache and a print-only helper on 2 processes (AM009).

The script (the shape of a text classifier's training script) makes a cache when it is missing
(`if os.path.isfile(cache): torch.load else: compute; torch.save`), saves the whole model every
step and removes the older snapshots (`for f in glob.glob(prefix + "*"): if f != path:
os.remove(f)`), and evaluates through a helper that only prints. Migrated with the CLI, it runs on
one process next to its original (same output, the snapshot still holds the whole module) and
under `accel launch --nproc-per-node 2`: it must finish (N processes removing the same files
race: FileNotFoundError), rank 0 alone removes files (a `sitecustomize` on PYTHONPATH records each
`os.remove` with the rank that made it), one snapshot is left and loads as the user's module (not
the wrapper), and the helper's line is printed once per epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

SITECUSTOMIZE = '''
import os

_remove = os.remove


def _recording_remove(path, *args, **kwargs):
    out = os.environ.get("LOG_CALLS_DIR")
    if out and str(path).startswith(out):
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(out, f"calls_rank{rank}.txt"), "a") as f:
            f.write(f"remove {os.path.basename(str(path))}\\n")
    return _remove(path, *args, **kwargs)


os.remove = _recording_remove
'''

SCRIPT = '''
import glob
import os
import sys

import torch
from torch.utils.data import DataLoader


def show_sample(model, sample, epoch):
    with torch.no_grad():
        value = model(sample).sum().item()
    print(f"sample after epoch {epoch}: {value:.4f}")


def main(out):
    torch.manual_seed(0)
    cache = os.path.join(out, "points.pt")
    if os.path.isfile(cache):
        points = torch.load(cache)
    else:
        points = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
        torch.save(points, cache)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(points, batch_size=2)
    snapshots = os.path.join(out, "snapshots")
    os.makedirs(snapshots, exist_ok=True)
    step = 0
    for epoch in range(2):
        for x in loader:
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            prefix = os.path.join(snapshots, "snapshot")
            path = prefix + f"_step_{step:03d}.pt"
            torch.save(model, path)
            for old in glob.glob(prefix + "*"):
                if old != path:
                    os.remove(old)
        show_sample(model, torch.ones(1, 4), epoch)
    print("steps", step)


if __name__ == "__main__":
    main(sys.argv[1])
'''


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "sitecustomize.py").write_text(SITECUSTOMIZE)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    return fakes, original, migrated


def _run(fakes: Path, script: Path, out: Path, nproc: int | None) -> tuple[dict[str, list[str]], str]:
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out)]
    result = run_cmd(cmd, cwd=out, timeout=TIMEOUT)
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return recorded_calls(out), result.stdout


def _snapshot(out: Path) -> Path:
    left = sorted((out / "snapshots").iterdir())
    assert len(left) == 1, left
    return left[0]


def test_snapshots_cleanup_and_cache_on_the_main_process(tmp_path: Path) -> None:
    fakes, original, migrated = _setup(tmp_path)
    text = migrated.read_text()
    assert ("if accelerator.is_main_process:\n"
            "                    accelerator.save(accelerator.unwrap_model(model), path)\n"
            "                    for old in glob.glob(prefix + \"*\"):") in text, text
    assert "with accelerator.main_process_first():\n        if os.path.isfile(cache):" in text, text
    assert "def show_sample(model, sample, epoch, accelerator):" in text, text
    assert "accelerator.print(f\"sample after epoch" in text, text

    single, single_out = _run(fakes, original, tmp_path / "original", None)
    assert len(single["calls_rank0"]) == 31, single  # 32 snapshots, all but the last removed
    one, one_out = _run(fakes, migrated, tmp_path / "one", None)
    assert one == single and one_out == single_out
    assert _snapshot(tmp_path / "one").name == "snapshot_step_032.pt"
    saved = torch.load(_snapshot(tmp_path / "one"), weights_only=False)
    assert type(saved) is torch.nn.Linear  # the whole module, as the original saved it

    two, two_out = _run(fakes, migrated, tmp_path / "two", 2)
    assert set(two) == {"calls_rank0"}, "rank 1 removed files too" if "calls_rank1" in two else two
    assert len(two["calls_rank0"]) == 15, two  # 16 steps per rank: one snapshot each, all but the last removed
    assert _snapshot(tmp_path / "two").name == "snapshot_step_016.pt"
    assert type(torch.load(_snapshot(tmp_path / "two"), weights_only=False)) is torch.nn.Linear
    assert (tmp_path / "two" / "points.pt").is_file()
    for epoch in range(2):
        assert two_out.count(f"sample after epoch {epoch}:") == 1, two_out
    assert "steps 16" in two_out, two_out
