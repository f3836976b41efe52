"""A dataset class of the script that subclasses a library's dataset and downloads through
`super().__init__(root, ..., download=True)` (torchaudio's SPEECHCOMMANDS tutorial shape), on 2
processes: the main process downloads first (AM009).

The same fake `torchvision.datasets.MNIST` as test_download_main_process_first.py (it records each
download with its rank, and raises on a half-written folder). Launched as it is on 2 processes,
both ranks download; migrated with the CLI, the statements building the subclass run under
`with accelerator.main_process_first():`, so rank 0 downloads each split once, and the migrated
script prints the original's result on one process and trains on its half on two.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script, recorded_calls  # noqa: E402
from test_download_main_process_first import FAKE_DATASETS  # noqa: E402

TIMEOUT = 180

SCRIPT = """
import sys

import torch
from torch.utils.data import DataLoader
from torchvision.datasets import MNIST


class Split(MNIST):
    def __init__(self, root, subset):
        super().__init__(root, train=subset == "training", download=True)
        self.subset = subset


torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_set = Split(sys.argv[1], "training")
test_set = Split(sys.argv[1], "testing")
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
"""


def _run(fakes: Path, script: Path, out: Path, nproc: int | None):
    out.mkdir()
    env = ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={out}"]
    launch = [accel_executable(), "launch", "--nproc-per-node", str(nproc)] if nproc else [sys.executable]
    cmd = [*env, *launch, str(script), str(out / "data")]
    return run_cmd(cmd, cwd=out, timeout=TIMEOUT), recorded_calls(out)


def test_subclass_downloading_through_super_is_built_by_the_main_process_first(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    (fakes / "torchvision").mkdir(parents=True)
    (fakes / "torchvision" / "__init__.py").write_text("")
    (fakes / "torchvision" / "datasets.py").write_text(FAKE_DATASETS)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert ("with accelerator.main_process_first():\n"
            "    train_set = Split(sys.argv[1], \"training\")\n"
            "    test_set = Split(sys.argv[1], \"testing\")\n") in text, text

    # The original on 2 processes: both ranks download into the same folder.
    result, calls = _run(fakes, original, tmp_path / "original", 2)
    assert "calls_rank1" in calls and "download train" in calls["calls_rank1"], (calls, result.stderr[-2000:])

    result, calls = _run(fakes, original, tmp_path / "original-one", None)
    assert result.returncode == 0 and "seen 16 test 8" in result.stdout, result.stderr[-3000:]

    result, calls = _run(fakes, migrated, tmp_path / "one", None)
    assert result.returncode == 0, result.stderr[-3000:]
    assert calls == {"calls_rank0": ["download train", "download test"]}, calls
    assert "seen 16 test 8" in result.stdout, result.stdout

    result, calls = _run(fakes, migrated, tmp_path / "two", 2)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert calls == {"calls_rank0": ["download train", "download test"]}, calls
    assert "seen 8 test 8" in result.stdout, result.stdout  # rank 0 printed its half
