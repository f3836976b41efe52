"""PIL images written during an evaluation, on 2 processes: only the main process writes (AM009).

The shape of a segmentation repository's `validate` (DeepLabV3Plus-Pytorch main.py with
`--save_val_results`): over an evaluation loader that stays whole on every process, each predicted
mask is written with `Image.fromarray(pred).save(path)`, and another as `mask =
Image.fromarray(...)` then `mask.save(path)`. A fake `PIL` package (on PYTHONPATH) records each save
with the rank that made it. Migrated by the CLI: on one process the migrated script saves exactly
what the original saves, with the same losses; under `accel launch --nproc-per-node 2` rank 0 makes
every save of the one-process run and rank 1 none (before: both ranks wrote every file at once).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import RECORD_CALLS, accel_executable, migrated_script, recorded_calls  # noqa: E402

TIMEOUT = 180

FAKE_IMAGE = RECORD_CALLS + '''

class Image:
    def __init__(self, array):
        self.shape = tuple(array.shape)

    def save(self, fp, format=None, **params):
        _record(f"save {os.path.basename(str(fp))} {self.shape}")


def fromarray(array, mode=None):
    return Image(array)
'''

SCRIPT = '''
import os

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def validate(model, loader, device, out):
    img_id = 0
    with torch.no_grad():
        for x, y in loader:
            x = x.to(device)
            preds = model(x).argmax(dim=1).cpu().numpy()
            for pred in preds:
                Image.fromarray(np.full((4, 4), pred, dtype=np.uint8)).save(os.path.join(out, "%d_pred.png" % img_id))
                mask = Image.fromarray(np.zeros((2, 2), dtype=np.uint8))
                mask.save(os.path.join(out, "%d_mask.png" % img_id))
                img_id += 1


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(4, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,))), batch_size=8)
    val_loader = DataLoader(TensorDataset(torch.randn(6, 4), torch.randint(0, 3, (6,))), batch_size=4)
    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} step {step} loss {loss.item():.6f}")
        validate(model, val_loader, device, "results")


if __name__ == "__main__":
    main()
'''


def _env(fakes: Path, log: Path) -> list[str]:
    return ["env", f"PYTHONPATH={fakes}", f"LOG_CALLS_DIR={log}"]


def test_pil_image_saves_run_on_the_main_process_only(tmp_path: Path) -> None:
    fakes = tmp_path / "fakes"
    (fakes / "PIL").mkdir(parents=True)
    (fakes / "PIL" / "__init__.py").write_text("")
    (fakes / "PIL" / "Image.py").write_text(FAKE_IMAGE)
    original, migrated = migrated_script(tmp_path, SCRIPT, TIMEOUT)
    text = migrated.read_text()
    assert text.count("if accelerator.is_main_process:") == 2, text

    logs = {name: tmp_path / name for name in ("original", "one", "two")}
    for log in logs.values():
        log.mkdir()
    first = run_cmd([*_env(fakes, logs["original"]), sys.executable, str(original)], tmp_path, TIMEOUT)
    one = run_cmd([*_env(fakes, logs["one"]), sys.executable, str(migrated)], tmp_path, TIMEOUT)
    assert first.returncode == 0 and one.returncode == 0, first.stderr + one.stderr
    assert one.stdout == first.stdout  # the same losses
    expected = recorded_calls(logs["original"])["calls_rank0"]
    assert len(expected) == 2 * 6 * 2  # 2 epochs x 6 samples x 2 images
    assert recorded_calls(logs["one"]) == {"calls_rank0": expected}

    two = run_cmd([*_env(fakes, logs["two"]), accel_executable(), "launch", "--nproc-per-node", "2", str(migrated)],
                  tmp_path, TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    calls = recorded_calls(logs["two"])
    assert calls.get("calls_rank1", []) == []
    assert calls["calls_rank0"] == expected  # the evaluation loader is whole: every image, once
