"""End to end: a trainer class (minGPT's shape, our own code) builds its DataLoader in the method
that builds the optimizer and draws batches with `next(data_iter)` in a `while True` loop, making a
fresh iterator on `StopIteration`; the device is chosen in the constructor in an if/else, and the
constructor prints it.

Before: the training step was reported as fed by no DataLoader (the `while` loop was not read as a
training loop) and the constructor's print was guarded with a `self.accelerator` not yet bound
(AM101). Now the loader is prepared with the model and the optimizer, and the constructor's
"auto"-or-named device creates the Accelerator there (`cpu=` true when the settings name the CPU),
so its print is the Accelerator's.

Checked, migrated with the CLI: one process prints the original's losses and draws the original's
samples; two gloo processes each draw half of every pass over the data (disjoint, together every
sample once) and end with equal weights.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))  # the shared torchrun helpers
from original_and_migrated import migrate_into, run_copy  # noqa: E402

TIMEOUT = 180
SAMPLES, BATCH, STEPS = 40, 5, 16  # 8 batches a pass: 2 passes on 1 process, 4 half-passes on each of 2
LINE = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)

SCRIPT = '''
    """A step-count trainer drawing batches with next() in while True."""
    import os

    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class StepTrainer:
        def __init__(self, settings, net, dataset):
            self.settings = settings
            self.net = net
            self.dataset = dataset
            if settings["device"] == "auto":
                self.device = "cuda" if torch.cuda.is_available() else "cpu"
            else:
                self.device = settings["device"]
            self.net = self.net.to(self.device)
            print("training on", self.device)
            self.step = 0

        def fit(self):
            net, settings = self.net, self.settings
            self.optimizer = torch.optim.SGD(net.parameters(), lr=settings["lr"])
            batches = DataLoader(self.dataset, batch_size=settings["batch_size"], shuffle=True)
            net.train()
            seen = []
            it = iter(batches)
            while True:
                try:
                    ids, inputs, targets = next(it)
                except StopIteration:
                    it = iter(batches)
                    ids, inputs, targets = next(it)
                seen.extend(ids.tolist())
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                loss = torch.nn.functional.mse_loss(net(inputs), targets)
                net.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                self.step += 1
                if self.step % 4 == 0:
                    print(f"step {self.step} loss {loss.item():.6f}")
                if self.step >= settings["max_steps"]:
                    break
            weights = sum(p.detach().double().abs().sum().item() for p in net.parameters())
            with open(f"seen-{os.environ.get('RANK', '0')}.txt", "w") as f:
                f.write(repr((seen, weights)))


    if __name__ == "__main__":
        torch.manual_seed(0)
        x = torch.randn(40, 4)
        data = TensorDataset(torch.arange(40), x, x.sum(dim=1, keepdim=True))
        settings = {"device": "auto", "lr": 0.05, "batch_size": 5, "max_steps": 16}
        StepTrainer(settings, torch.nn.Linear(4, 1), data).fit()
'''


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return migrate_into(tmp_path_factory.mktemp("while_loop_loader"), "trainer.py", SCRIPT, TIMEOUT)


def _seen(run_dir: Path, rank: int) -> tuple[list[int], float]:
    return ast.literal_eval((run_dir / f"seen-{rank}.txt").read_text())


def test_the_loader_is_prepared_and_the_constructor_chooses_the_device(folder: Path) -> None:
    migrated = (folder / "migrated" / "trainer.py").read_text()
    assert "net, self.optimizer, batches = self.accelerator.prepare(net, self.optimizer, batches)" in migrated
    # the constructor's "auto"-or-named device creates the Accelerator there, with the CPU when named
    assert "self.accelerator = Accelerator(cpu=settings[\"device\"] != \"auto\" and " in migrated
    assert '        self.accelerator.print("training on", self.device)\n' in migrated


def test_one_process_trains_like_the_original(folder: Path) -> None:
    original, original_dir = run_copy(folder, "original", "trainer.py", 1, TIMEOUT)
    migrated, run_dir = run_copy(folder, "migrated", "trainer.py", 1, TIMEOUT)
    assert len(LINE.findall(original.stdout)) == STEPS // 4
    assert migrated.stdout == original.stdout
    assert _seen(run_dir, 0) == _seen(original_dir, 0)


def test_two_processes_each_draw_half_of_every_pass(folder: Path) -> None:
    proc, run_dir = run_copy(folder, "migrated", "trainer.py", 2, TIMEOUT)
    assert len(LINE.findall(proc.stdout)) == STEPS // 4  # the main process only
    (seen0, weights0), (seen1, weights1) = _seen(run_dir, 0), _seen(run_dir, 1)
    assert len(seen0) == len(seen1) == STEPS * BATCH
    half = SAMPLES // 2
    for start in range(0, STEPS * BATCH, half):
        first, second = set(seen0[start:start + half]), set(seen1[start:start + half])
        assert not first & second and first | second == set(range(SAMPLES))
    assert weights0 == weights1
