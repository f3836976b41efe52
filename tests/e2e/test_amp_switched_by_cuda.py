"""AMP switched on only where CUDA is: `GradScaler(enabled=torch.cuda.is_available())` with
`autocast(enabled=torch.cuda.is_available())` (AM006).

The switch reads an imported function, the same wherever the Accelerator is created, so the AMP
code becomes `Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no")` (before,
it was kept with a report saying the value could not be traced there). Here, without CUDA, both
the original and the migrated script train in fp32: on one process the printed losses are
bit-identical, and on two each rank trains on its half.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = """
import torch
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(torch.randn(16, 4), batch_size=4)
    scaler = GradScaler(enabled=torch.cuda.is_available())
    seen = 0
    for epoch in range(2):
        for x in loader:
            x = x.to(device)
            optimizer.zero_grad()
            with autocast(enabled=torch.cuda.is_available()):
                loss = model(x).pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            seen += len(x)
            print(f"loss {loss.item():.8f}")
    print("seen", seen)


if __name__ == "__main__":
    main()
"""


def test_amp_switched_by_cuda_availability_is_converted(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    text = (folder / "migrated" / "train.py").read_text()
    assert 'Accelerator(mixed_precision="fp16" if torch.cuda.is_available() else "no")' in text, text
    assert "GradScaler" not in text and "with accelerator.autocast():" in text, text

    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    one, _ = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert one.stdout == original.stdout and "seen 32" in original.stdout, (original.stdout, one.stdout)
    two, _ = run_copy(folder, "migrated", "train.py", 2, TIMEOUT)
    assert two.stdout.count("seen 16") == 1, two.stdout  # the main process prints, its half
