"""Batches drawn through a generator of the script (`def cycle(loader): while True: for b in loader:
yield b`, then `next(batches)` in a step loop: the shape of many single-file language-model
scripts): the loader it cycles is prepared, so on 2 gloo processes each rank draws its half of
every pass and both end with the same weights; on 1 process the migrated script prints the
original's lines. Taken before the optimizer is built, the same generator refuses the file (the
golden fixture `leave_iterator_taken_before_prepare` covers `iter(...)`), checked here for
`cycle(...)`: the CLI leaves the file as it is and says which line to move.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import ROOT, migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import os

import torch
from torch.utils.data import DataLoader, TensorDataset


def cycle(loader):
    while True:
        for batch in loader:
            yield batch


torch.manual_seed(0)
data = TensorDataset(torch.arange(32, dtype=torch.float32).unsqueeze(1), torch.randn(32, 1))
loader = DataLoader(data, batch_size=4)
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
batches = cycle(loader)
seen = []
for step in range(8):
    x, y = next(batches)
    seen.extend(int(v) for v in x.flatten().tolist())
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
with open(f"rank{os.environ.get('RANK', '0')}.txt", "w") as f:
    f.write(" ".join(map(str, seen)) + "\\n" + " ".join(f"{p.item():.6f}" for p in model.parameters()))
'''


def test_generator_cycled_loader_is_prepared(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    text = (folder / "migrated" / "train.py").read_text()
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\nbatches = cycle(loader)" in text, text
    original, original_dir = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    migrated, migrated_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == migrated.stdout and "step 7 loss" in original.stdout
    assert (original_dir / "rank0.txt").read_text() == (migrated_dir / "rank0.txt").read_text()

    _, two = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    seen0, weights0 = (two / "rank0.txt").read_text().splitlines()
    seen1, weights1 = (two / "rank1.txt").read_text().splitlines()
    assert weights0 == weights1
    # each rank cycles over its own half (4 batches of 4) twice in 8 steps: the halves are disjoint
    # and together hold every sample
    half0, half1 = set(map(int, seen0.split())), set(map(int, seen1.split()))
    assert len(half0) == len(half1) == 16 and half0 | half1 == set(range(32))
    assert sorted(map(int, seen0.split())) == sorted(list(half0) * 2)


def test_generator_taken_before_the_optimizer_refuses(tmp_path: Path) -> None:
    early = SCRIPT.replace("batches = cycle(loader)\n", "").replace(
        "loader = DataLoader(data, batch_size=4)\n", "loader = DataLoader(data, batch_size=4)\nbatches = cycle(loader)\n")
    script = tmp_path / "train.py"
    script.write_text(early)
    result = subprocess.run([sys.executable, "-m", "migrate", "--diff", str(script)],
                            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    report = result.stdout + result.stderr
    assert result.returncode == 1 and "1 refused" in report, report
    assert "train.py:17: AM004" in report and "move this line below the line that builds the optimizer" in report, report
