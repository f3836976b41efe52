"""Datasets built with `download=True` on 2 processes: the main process downloads first (AM009).

A training script builds a torchvision-style dataset with `download=True` (directly, and through a
helper of the script) and trains on it. torchvision is not installed here: a fake
`torchvision.datasets.MNIST`, put on PYTHONPATH by the test, downloads as torchvision does when the
files are missing (records the download with the rank that made it, writes the data file, sleeps,
then writes the marker a later process finds) and raises, as torchvision does, when it finds a
half-written folder. Launched as it is on 2 processes, both ranks download into the same folder.
Migrated with the CLI and launched with `accel launch --nproc-per-node 2`, the dataset statements
run under `with accelerator.main_process_first():`: rank 0 downloads each split once, rank 1 finds
the files, and both train on their half.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_DATASETS = RECORD_CALLS + '''
import time

import torch


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, download=False, transform=None):
        folder = os.path.join(root, "train" if train else "test")
        marker = os.path.join(folder, "done")
        if download and not os.path.exists(marker):
            _record(f"download {os.path.basename(folder)}")
            os.makedirs(folder, exist_ok=True)
            torch.save(torch.randn(16 if train else 8, 4), os.path.join(folder, "points.pt"))
            time.sleep(1.0)
            with open(marker, "w") as f:
                f.write("ok")
        if not os.path.exists(marker):
            raise RuntimeError(f"Dataset not found or corrupted: {folder}")
        self.points = torch.load(os.path.join(folder, "points.pt"))

    def __len__(self):
        return len(self.points)

    def __getitem__(self, index):
        return self.points[index]
'''

SCRIPT = """
import sys

import torch
from torch.utils.data import DataLoader
from torchvision import datasets


def held_out(root):
    return datasets.MNIST(root, train=False, download=True)


def main(root):
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_set = datasets.MNIST(root, train=True, download=True)
    test_set = held_out(root)
    loader = DataLoader(train_set, batch_size=4)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = 0
    for x in loader:
        x = x.to(device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(x)
    print("seen", seen, "test", len(test_set))


if __name__ == "__main__":
    main(sys.argv[1])
"""


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    fakes = tmp_path / "fakes"
    (fakes / "torchvision").mkdir(parents=True)
    (fakes / "torchvision" / "__init__.py").write_text("")
    (fakes / "torchvision" / "datasets.py").write_text(FAKE_DATASETS)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    return fakes, original, migrated


def _run(fakes: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out / "data")]
    return run_cmd(cmd, cwd=out, timeout=TIMEOUT), recorded_calls(out)


def test_datasets_with_download_are_built_by_the_main_process_first(tmp_path: Path) -> None:
    fakes, original, migrated = _setup(tmp_path)
    text = migrated.read_text()
    assert ("    with accelerator.main_process_first():\n"
            "        train_set = datasets.MNIST(root, train=True, download=True)\n"
            "        test_set = held_out(root)\n") in text, text

    # The original on 2 processes: both ranks download into the same folder.
    result, calls = _run(fakes, original, tmp_path / "original", 2)
    assert "calls_rank1" in calls and "download train" in calls["calls_rank1"], (calls, result.stderr[-2000:])

    result, calls = _run(fakes, migrated, tmp_path / "one", None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["download train", "download test"]}
    assert "seen 16 test 8" in result.stdout, result.stdout

    result, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert calls == {"calls_rank0": ["download train", "download test"]}, calls
    assert "seen 8 test 8" in result.stdout, result.stdout  # rank 0 printed its half
