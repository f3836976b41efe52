"""Loaders found from what the training step uses, across modules of one run: a loader returned by
another module's `get_loader` (a module with no training code of its own) and drawn with `next`,
and a solver class of another module handed the loaders `main` builds, choosing its device on
`self` in its constructor. Own synthetic repositories, written by the tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

from migrate.engine import Options
from migrate.runner import run

DATA = '''
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def get_loader(samples, batch_size):
        x = torch.randn(samples, 4)
        dataset = TensorDataset(x, x[:, :1])
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
        return loader
'''

NEXT_MAIN = '''
    import torch
    import torch.nn as nn

    from data_loader import get_loader


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = get_loader(32, 4)
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = iter(loader)
        for step in range(16):
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


    if __name__ == "__main__":
        main()
'''

SOLVER = '''
    import torch
    import torch.nn as nn


    class Solver:
        def __init__(self, train_loader, config):
            self.train_loader = train_loader
            self.steps = config.steps
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            self.build_model()

        def build_model(self):
            self.net = nn.Linear(4, 1)
            self.optimizer = torch.optim.Adam(self.net.parameters(), 1e-3)
            self.net.to(self.device)

        def train(self):
            data_iter = iter(self.train_loader)
            for i in range(self.steps):
                try:
                    x, y = next(data_iter)
                except StopIteration:
                    data_iter = iter(self.train_loader)
                    x, y = next(data_iter)
                loss = nn.functional.mse_loss(self.net(x.to(self.device)), y.to(self.device))
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
'''

SOLVER_MAIN = '''
    import argparse

    from data_loader import get_loader
    from solver import Solver


    def main(config):
        loader = get_loader(32, 4)
        solver = Solver(loader, config)
        solver.train()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--steps", type=int, default=10)
        main(parser.parse_args())
'''


def _repo(tmp_path: Path, files: dict[str, str]) -> dict[str, object]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    report = run([tmp_path], Options(), write=False)
    return {Path(r.path).name: r for r in report.results}


def test_a_loader_from_another_modules_get_loader_drawn_with_next_is_prepared(tmp_path: Path) -> None:
    results = _repo(tmp_path, {"data_loader.py": DATA, "main.py": NEXT_MAIN})
    main, data = results["main.py"], results["data_loader.py"]
    assert "    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n" in main.new_text
    assert not main.diagnostics  # before: "`loader` ... is not a recognised DataLoader"
    assert not data.changed


def test_a_solver_of_another_module_creates_the_accelerator_at_its_device_and_prepares_the_loader(
    tmp_path: Path,
) -> None:
    results = _repo(tmp_path, {"data_loader.py": DATA, "solver.py": SOLVER, "main.py": SOLVER_MAIN})
    solver = results["solver.py"]
    text = solver.new_text
    assert ("        self.accelerator = Accelerator()\n"
            "        self.device = self.accelerator.device\n") in text
    assert "cpu=True" not in text  # the device is chosen on self in solver.py, not in main.py
    assert ("        self.net, self.optimizer, self.train_loader = self.accelerator.prepare(\n"
            "            self.net, self.optimizer, self.train_loader\n") in text
    assert "self.net.to(" not in text
    assert not solver.diagnostics  # before: "no DataLoader feeds this training step"
    assert not results["main.py"].changed and not results["data_loader.py"].changed
