"""A trainer class whose optimizer comes from its own hook (`self.optimizer =
self.build_optimizer(lr, self.model)`, a classmethod returning a module function's
`torch.optim.SGD` over parameter groups of `model.named_parameters()`: the detectron2
`DefaultTrainer` shape, fixtures/prepare_training_objects/trainer_optimizer_from_own_method).
Before: refused, "a method `build_optimizer()` of `self` that no class of this file defines".
Now the model, the optimizer and the loader are prepared in the constructor: one process trains
as the original (identical losses); two run the same 12 steps, printed once by the main process.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from rt_helpers import run_cmd  # noqa: E402

from call_recording import accel_executable, migrated_script  # noqa: E402

TIMEOUT = 180
ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "fixtures" / "prepare_training_objects" / "trainer_optimizer_from_own_method.in.py"
STEP = re.compile(r"^step (\d+) loss ([0-9.]+)$", re.M)


def test_optimizer_from_the_trainers_own_method_trains_on_one_and_two(tmp_path: Path) -> None:
    text = FIXTURE.read_text().replace(
        "            self.optimizer.step()\n",
        '            self.optimizer.step()\n            print(f"step {step} loss {loss.item():.6f}")\n',
    ).replace(
        '    Trainer(0.05, 12).train()\n',
        '    torch.manual_seed(0)\n    trainer = Trainer(0.05, 12)\n    trainer.train()\n'
        '    import os\n'
        '    if os.environ.get("RANK", "0") == "0":\n'
        '        w = next(iter(trainer.model.parameters())).detach().flatten()[:4].tolist()\n'
        '        print("weights", " ".join(f"{v:.6f}" for v in w))\n',
    )
    original, migrated = migrated_script(tmp_path, text, TIMEOUT)
    source = migrated.read_text()
    assert "self.accelerator.prepare(\n            self.model, self.optimizer, self.data_loader\n        )" in source

    first = run_cmd([sys.executable, str(original)], tmp_path, TIMEOUT)
    one = run_cmd([sys.executable, str(migrated)], tmp_path, TIMEOUT)
    assert first.returncode == 0 and one.returncode == 0, first.stderr + one.stderr
    assert len(STEP.findall(first.stdout)) == 12 and STEP.findall(one.stdout) == STEP.findall(first.stdout)

    two = run_cmd([accel_executable(), "launch", "--nproc-per-node", "2", str(migrated)], tmp_path, TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    assert [s for s, _ in STEP.findall(two.stdout)] == [str(i) for i in range(12)]  # printed once
    assert two.stdout.count("weights") == 1
