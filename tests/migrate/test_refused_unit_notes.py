"""A unit left as it is (all or nothing: the entry trains through `engine.train_fn(...)`, a call
through the module object the cross-module view does not follow) keeps only the diagnostics that
leave training code unconverted: notes on the single-file rewrite it no longer gets (AM009's
"the migrated script saves the bare model's keys") would describe code that was not written.
Own synthetic unit, written by the test."""

from __future__ import annotations

import textwrap
from pathlib import Path

from migrate.engine import Options
from migrate.runner import run

ENGINE = '''
    import torch.nn as nn


    def train_fn(loader, model, optimizer, device):
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
'''

TRAIN = '''
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    import engine


    def run():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        x = torch.randn(16, 3)
        loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=4)
        model = nn.Linear(3, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model = nn.DataParallel(model)
        for epoch in range(2):
            engine.train_fn(loader, model, optimizer, device)
            torch.save(model.state_dict(), "model.bin")


    if __name__ == "__main__":
        run()
'''


def test_a_refused_unit_keeps_no_notes_on_the_rewrite_it_does_not_get(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(textwrap.dedent(ENGINE).lstrip())
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN).lstrip())
    report = run([tmp_path], Options(), write=False)
    results = {Path(r.path).name: r for r in report.results}
    train = results["train.py"]
    assert not train.changed
    codes = [d.code for d in train.diagnostics]
    assert "AM013" in codes and "engine.train_fn" in " ".join(d.message for d in train.diagnostics)
    assert "AM009" not in codes  # before: "the original wrapped `model` in `nn.DataParallel` ... the migrated script saves"
    assert all(d.unconverted for d in train.diagnostics)
