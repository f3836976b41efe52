"""A pix2pix/CycleGAN-repo shape: a model class that is not a module holds the networks and the
optimizers, the `__main__` loop hands each batch of a DataLoader to `model.set_input(batch)`
(kept in attributes) and trains with `model.optimize_parameters()`. The migration prepares the
networks and optimizers in the class and reports (AM004) that the loader is not prepared, at its
binding, with the line to add. Followed literally, that line makes a second run report nothing and
change nothing; the result trains as the original on 1 process, and at 2 each rank draws half of
every epoch's batches and the ranks end with the same weights."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import ROOT, run_copy  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import json
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PairModel:
    def __init__(self, lr):
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.netG = nn.Linear(4, 4).to(self.device)
        self.netD = nn.Linear(8, 1).to(self.device)
        self.opt_G = torch.optim.Adam(self.netG.parameters(), lr=lr)
        self.opt_D = torch.optim.Adam(self.netD.parameters(), lr=lr)
        self.seen = 0

    def set_input(self, data):
        self.real_A = data[0].to(self.device)
        self.real_B = data[1].to(self.device)
        self.seen += len(data[0])

    def optimize_parameters(self):
        fake_B = self.netG(self.real_A)
        self.opt_D.zero_grad()
        pred_fake = self.netD(torch.cat((self.real_A, fake_B.detach()), 1))
        pred_real = self.netD(torch.cat((self.real_A, self.real_B), 1))
        self.loss_D = (pred_fake ** 2).mean() + ((pred_real - 1) ** 2).mean()
        self.loss_D.backward()
        self.opt_D.step()
        self.opt_G.zero_grad()
        pred = self.netD(torch.cat((self.real_A, fake_B), 1))
        self.loss_G = ((pred - 1) ** 2).mean() + (fake_B - self.real_B).abs().mean()
        self.loss_G.backward()
        self.opt_G.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    dataset = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 4)), batch_size=4, shuffle=True)
    model = PairModel(2e-3)
    for epoch in range(2):
        for data in dataset:
            model.set_input(data)
            model.optimize_parameters()
        print(f"epoch {epoch} G {model.loss_G.item():.6f} D {model.loss_D.item():.6f}")
    net = model.netG.module if hasattr(model.netG, "module") else model.netG
    with open(f"rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump({"seen": model.seen, "weight": net.weight.tolist()}, f)
'''


def _migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "migrate", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT)


def test_advice_followed_trains_at_1_and_2_processes(tmp_path: Path) -> None:
    (tmp_path / "original").mkdir()
    (tmp_path / "original" / "train.py").write_text(SCRIPT.lstrip())
    first = _migrate("--output-dir", str(tmp_path / "migrated"), str(tmp_path / "original"))
    report = first.stdout + first.stderr
    binding = SCRIPT.lstrip().splitlines().index(
        "    dataset = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 4)), batch_size=4, shuffle=True)") + 1
    assert f"train.py:{binding}: AM004" in report, report
    assert "model.set_input(...)" in report and "model.optimize_parameters(...)" in report
    # the advice, followed literally: the line it names, below the bindings of the loader and the model
    line = re.search(r"add `(dataset = [^`]*)`", report)
    assert line is not None and line.group(1) == "dataset = model.accelerator.prepare(dataset)", report
    migrated = tmp_path / "migrated" / "train.py"
    text = migrated.read_text()
    assert "self.accelerator.prepare(self.netG,self.netD,self.opt_G,self.opt_D)" in "".join(text.split())
    anchor = "    model = PairModel(2e-3)\n"
    assert text.count(anchor) == 1
    migrated.write_text(text.replace(anchor, anchor + "    " + line.group(1) + "\n"))
    followed = migrated.read_text()
    second = _migrate("--check", str(migrated))
    assert second.returncode == 0 and "AM004" not in second.stdout + second.stderr, second.stdout + second.stderr
    assert migrated.read_text() == followed

    _, original_dir = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    original_out = (original_dir / "rank0.json").read_text()
    assert json.loads(original_out)["seen"] == 64
    assert (one_dir / "rank0.json").read_text() == original_out
    two, two_dir = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    ranks = [json.loads((two_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["seen"] for r in ranks] == [32, 32]  # each rank half of every epoch
    assert ranks[0]["weight"] == ranks[1]["weight"]
