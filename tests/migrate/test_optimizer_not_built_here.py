"""An optimizer from `model.configure_optimizers(config)`, the model's class in another module: a
trainer module whose optimizer comes from it (minGPT's trainer) is migrated alone as it is with
the model's module and the script that runs the trainer (the method's result is stepped after
`backward`, the receiver is the model the step calls); from a script, the method is followed when
the model's module is in the run or read beside it, and found from use when it is not. A method of
an object that is not the model is reported by AM003, saying where to prepare."""

from __future__ import annotations

from pathlib import Path

from migrate.engine import Options
from migrate.runner import run

MODEL = """\
import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(x)

    def configure_optimizers(self, settings):
        return torch.optim.SGD(self.parameters(), lr=settings["lr"])
"""

TRAINER = """\
import torch
from torch.utils.data import DataLoader


class Loop:
    def __init__(self, settings, model, dataset):
        self.settings = settings
        self.model = model
        self.dataset = dataset

    def run(self):
        model, settings = self.model, self.settings
        self.optimizer = model.configure_optimizers(settings)
        loader = DataLoader(self.dataset, batch_size=4, shuffle=True)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            model.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
"""

ENTRY = """\
import torch
from torch.utils.data import TensorDataset

from lib.model import Regressor
from lib.trainer import Loop


def main():
    data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    Loop({"lr": 0.1}, Regressor(), data).run()


if __name__ == "__main__":
    main()
"""

SCRIPT = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

from lib.model import Regressor


def main():
    model = Regressor()
    loader = DataLoader(TensorDataset(torch.randn(16, 3), torch.randn(16, 1)), batch_size=4)
    optimizer = model.configure_optimizers({"lr": 0.1})
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _results(*paths: Path) -> dict[str, object]:
    report = run(list(paths), Options(), write=False)
    return {Path(r.path).name: r for r in report.results}


def test_a_trainer_module_alone_migrates_as_with_the_models_module(tmp_path: Path) -> None:
    _write(tmp_path, {"lib/__init__.py": "", "lib/model.py": MODEL, "lib/trainer.py": TRAINER, "train.py": ENTRY})
    alone = _results(tmp_path / "lib" / "trainer.py")["trainer.py"]
    together = _results(tmp_path)["trainer.py"]
    assert alone.changed, alone.diagnostics
    assert alone.new_text == together.new_text
    assert not [d for d in alone.diagnostics if d.code == "AM003"]


def test_with_the_models_module_and_the_script_the_method_is_followed(tmp_path: Path) -> None:
    _write(tmp_path, {"lib/__init__.py": "", "lib/model.py": MODEL, "lib/trainer.py": TRAINER, "train.py": ENTRY})
    trainer = _results(tmp_path)["trainer.py"]
    assert trainer.changed, trainer.diagnostics
    text = trainer.new_text or ""
    assert "model, self.optimizer, loader = self.accelerator.prepare(" in text
    assert "self.accelerator.backward(loss)" in text
    assert not [d for d in trainer.diagnostics if d.code == "AM003"]


def test_from_the_script_itself_the_method_is_followed_with_the_models_module(tmp_path: Path) -> None:
    """The script's own loop, the optimizer from `model.configure_optimizers(...)` of a class in
    lib/model.py: the unit's view follows the method, and only the script is written (given the
    folder, or given alone with lib/model.py read beside it)."""
    _write(tmp_path, {"lib/__init__.py": "", "lib/model.py": MODEL, "train.py": SCRIPT})
    for given in (tmp_path, tmp_path / "train.py"):
        results = _results(given)
        script = results["train.py"]
        assert script.changed, script.diagnostics
        assert "optimizer = model.configure_optimizers({\"lr\": 0.1})\n    model, optimizer, loader = accelerator.prepare(" in (
            script.new_text or "")
        assert not script.diagnostics
        assert not any(r.changed for name, r in results.items() if name != "train.py")


def test_from_the_script_a_class_not_in_the_project_is_followed_from_use(tmp_path: Path) -> None:
    """The model's class comes from a package that is neither in the run nor beside the script: the
    method's result is stepped after backward and its receiver is the model the step calls, so the
    model is prepared with it right after that call."""
    _write(tmp_path, {"train.py": SCRIPT.replace("from lib.model import Regressor", "from somepackage.model import Regressor")})
    script = _results(tmp_path)["train.py"]
    assert script.changed, script.diagnostics
    assert "optimizer = model.configure_optimizers({\"lr\": 0.1})\n    model, optimizer, loader = accelerator.prepare(" in (
        script.new_text or "")
    assert not script.diagnostics


def test_a_method_of_an_object_that_is_not_the_model_is_reported(tmp_path: Path) -> None:
    """`hub.configure_optimizers(...)` of an object the training step never calls: nothing says
    which model it optimizes, so the file is reported with where to prepare by hand."""
    text = SCRIPT.replace("from lib.model import Regressor", "from somepackage.model import Hub, Regressor").replace(
        'optimizer = model.configure_optimizers({"lr": 0.1})',
        'hub = Hub(model)\n    optimizer = hub.configure_optimizers({"lr": 0.1})')
    _write(tmp_path, {"train.py": text})
    script = _results(tmp_path)["train.py"]
    assert not script.changed
    (message,) = [d.message for d in script.diagnostics if d.code == "AM003"]
    assert "a method `configure_optimizers()` of `hub`" in message
    assert "`accelerator.prepare(...)` right after that call" in message
