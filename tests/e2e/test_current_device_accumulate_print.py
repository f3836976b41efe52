"""A trainer class handed its objects through `**kwargs`, its training run inside
`with torch.cuda.device(gpu):`, and the options printed under `if __name__ == "__main__":` before
`main` creates the Accelerator. Migrated with the CLI: the `with` goes (its body kept), the loop is
wrapped in `accelerator.accumulate(self.net)` (the model traced through `kwargs["net"]`), and the
options line runs on the launcher's rank 0 only. One process prints what the original prints; two
processes under `accel launch --gradient-accumulation-steps 2` skip the gradient all-reduce on the
first micro-step (the ranks' gradients differ) and sync on the second (they agree), and print the
options once."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import migrate_into, run_copy  # noqa: E402
from rt_helpers import run_cmd  # noqa: E402

TIMEOUT = 180

SCRIPT = '''
import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


class Learner:
    def __init__(self, *args, **kwargs):
        self.opts = kwargs["opts"]
        self.net = kwargs["net"].to(self.opts.device)
        self.opt = kwargs["opt"]
        self.grads = []

    def fit(self, loader):
        for x, y in loader:
            x, y = x.to(self.opts.device), y.to(self.opts.device)
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.grads.append([round(v, 6) for v in next(self.net.parameters()).grad.flatten().tolist()])
            self.opt.step()
            print(f"loss {loss.item():.6f}")
        return self.grads


def main(opts):
    torch.manual_seed(0)
    opts.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = opts.gpu if torch.cuda.is_available() else -1
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    loader = DataLoader(data, batch_size=4, shuffle=False)
    with torch.cuda.device(gpu):
        learner = Learner(net=net, opt=opt, opts=opts)
        grads = learner.fit(loader)
    rank = os.environ.get("RANK", "0")
    with open(os.path.join(opts.out, f"rank{rank}.json"), "w") as f:
        json.dump({"grads": grads}, f)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--out", default=".")
    opts = parser.parse_args()
    print(opts)
    main(opts)
'''


def test_current_device_kwargs_model_and_early_print_at_1_and_2_processes(tmp_path: Path) -> None:
    folder = migrate_into(tmp_path, "train.py", SCRIPT, TIMEOUT)
    migrated = (folder / "migrated" / "train.py").read_text()
    assert "torch.cuda.device(" not in migrated
    assert "self.accelerator.accumulate(self.net)" in migrated
    assert 'if int(os.environ.get("RANK", "0")) == 0:\n        print(opts)' in migrated

    original, _ = run_copy(folder, "original", "train.py", 1, TIMEOUT)
    one, one_dir = run_copy(folder, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout
    assert original.stdout.count("Namespace(") == 1 and original.stdout.count("loss ") == 8

    two_dir = folder / "migrated-2"
    two_dir.mkdir()
    accel = shutil.which("accel", path=str(Path(sys.executable).parent)) or shutil.which("accel")
    assert accel, "the `accel` console script is not installed"
    cmd = [accel, "launch", "--nproc-per-node", "2", "--gradient-accumulation-steps", "2",
           str(folder / "migrated" / "train.py"), "--out", str(two_dir)]
    two = run_cmd(cmd, cwd=two_dir, timeout=TIMEOUT)
    assert two.returncode == 0, two.stdout + two.stderr
    assert two.stdout.count("Namespace(") == 1, two.stdout
    ranks = [json.loads((two_dir / f"rank{r}.json").read_text())["grads"] for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 4  # 32 samples, batches of 4, half each
    # micro-step 1 accumulates without the all-reduce: each rank has its own batch's gradient
    assert ranks[0][0] != ranks[1][0]
    # micro-step 2 syncs: the gradients (sums of both micro-steps) are averaged across the ranks
    assert ranks[0][1] == ranks[1][1]
    assert ranks[0][3] == ranks[1][3]
