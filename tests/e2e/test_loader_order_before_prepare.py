"""Values computed over a training loader before it is prepared (a knowledge-distillation shape:
a frozen teacher run over the loader as built; a baseline evaluation before the optimizer exists),
migrated with the CLI and run at 1 and 2 processes:

- teacher outputs read back by `enumerate`'s counter in the loop over the prepared loader: AM004
  reports the reading line (at 2 processes the migrated copy pairs rank 0's batches with other
  batches' targets: the report is true); its advice applied (the dataset returns each sample's
  index, the targets are read by it) migrates without a report and trains against the right
  targets on every process;
- a list of teacher outputs built before prepare and only averaged: no AM010 report (that loop
  runs over the loader as built), the same value on 1 and 2 processes;
- an evaluation function whose metric is gathered, called before prepare too: that call is handed
  a prepared copy of the loader (`accelerator.prepare_data_loader`), so at 2 processes its count
  covers every sample once, like the calls after prepare (over the loader as built it would
  count every sample twice).
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from original_and_migrated import ROOT, run_copy  # noqa: E402

TIMEOUT = 180


def migrate(folder: Path, script: str) -> str:
    """`script` written as `folder/original/train.py`, migrated into `folder/migrated`; the CLI's report."""
    (folder / "original").mkdir(parents=True)
    (folder / "original" / "train.py").write_text(textwrap.dedent(script).lstrip())
    result = subprocess.run(
        [sys.executable, "-m", "migrate", "--output-dir", str(folder / "migrated"), str(folder / "original")],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def line_of(script: str, text: str) -> int:
    lines = textwrap.dedent(script).lstrip().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def values(stdout: str, key: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(rf"^{key} (\S+)$", stdout, re.MULTILINE)]


KD_BY_POSITION = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def teacher_outputs(teacher, loader):
    teacher.eval()
    outs = torch.zeros(len(loader.dataset), 3)
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            outs[i * len(x):(i + 1) * len(x)] = teacher(x)
    return outs


def train(student, teacher, loader, outs, optimizer):
    worst = 0.0
    for i, (x, y) in enumerate(loader):
        out = student(x)
        target = outs[i * len(x):(i + 1) * len(x)]
        with torch.no_grad():
            worst = max(worst, (target - teacher(x)).abs().max().item())
        loss = nn.functional.mse_loss(out, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.6f}")
    return worst


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 5), torch.randint(0, 3, (32,))), batch_size=4)
teacher = nn.Linear(5, 3)
outs = teacher_outputs(teacher, loader)
student = nn.Linear(5, 3)
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
for epoch in range(2):
    print(f"mismatch {train(student, teacher, loader, outs, optimizer):.6f}")
'''

# The report's advice applied: the dataset returns each sample's index; the targets are kept per
# sample by that index (the loader may shuffle) and read by it in the step.
KD_BY_INDEX = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def teacher_outputs(teacher, loader):
    teacher.eval()
    outs = torch.zeros(len(loader.dataset), 3)
    with torch.no_grad():
        for x, y, index in loader:
            outs[index] = teacher(x)
    return outs


def train(student, teacher, loader, outs, optimizer):
    worst = 0.0
    for i, (x, y, index) in enumerate(loader):
        out = student(x)
        target = outs[index]
        with torch.no_grad():
            worst = max(worst, (target - teacher(x)).abs().max().item())
        loss = nn.functional.mse_loss(out, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss {loss.item():.6f}")
    return worst


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(32, 5), torch.randint(0, 3, (32,)), torch.arange(32)), batch_size=4, shuffle=True)
teacher = nn.Linear(5, 3)
outs = teacher_outputs(teacher, loader)
student = nn.Linear(5, 3)
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
for epoch in range(2):
    print(f"mismatch {train(student, teacher, loader, outs, optimizer):.6f}")
'''

LIST_CACHE_AVERAGED = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(30, 5), torch.randn(30, 3)), batch_size=4, shuffle=True)
teacher = nn.Linear(5, 3)
cached = []
with torch.no_grad():
    for x, y in loader:
        cached.append(teacher(x))
center = torch.cat(cached).mean(0)
print(f"center {center.sum().item():.6f}")
student = nn.Linear(5, 3)
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(student(x), y - center)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} {loss.item():.6f}")
'''

BASELINE_EVAL = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def evaluate(net, loader):
    net.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            pred = net(x).argmax(1)
            correct += (pred == y).sum().item()
            total += y.size(0)
    net.train()
    return correct, total


torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(37, 4), torch.randint(0, 3, (37,))), batch_size=4, shuffle=True)
net = nn.Linear(4, 3)
correct, total = evaluate(net, loader)
print(f"before {correct} {total}")
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    correct, total = evaluate(net, loader)
    print(f"epoch {epoch} {correct} {total}")
'''


def test_teacher_outputs_read_by_batch_position_reported(tmp_path: Path) -> None:
    report = migrate(tmp_path, KD_BY_POSITION)
    line = line_of(KD_BY_POSITION, "target = outs[i * len(x)")
    assert re.search(rf"train\.py:{line}: AM004 .*`outs\[i \* len\(x\):\(i \+ 1\) \* len\(x\)\]` reads `outs`", report), report
    assert "1 partial" in report
    original, _ = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, _ = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout and values(original.stdout, "mismatch") == [0.0, 0.0]
    # what the report says: at 2 processes rank 0's batch at position 1 is the loader's batch 2
    two, _ = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    assert all(v > 0 for v in values(two.stdout, "mismatch")), two.stdout


def test_teacher_outputs_read_by_sample_index_at_1_and_2_processes(tmp_path: Path) -> None:
    report = migrate(tmp_path, KD_BY_INDEX)
    assert "0 diagnostics" in report, report
    original, _ = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, _ = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout and values(original.stdout, "mismatch") == [0.0, 0.0]
    two, _ = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    assert values(two.stdout, "mismatch") == [0.0, 0.0], two.stdout
    assert len(values(two.stdout, "loss")) == 8  # the main process's 4 batches of 8, per epoch


def test_list_cache_before_prepare_not_reported(tmp_path: Path) -> None:
    report = migrate(tmp_path, LIST_CACHE_AVERAGED)
    assert "0 diagnostics" in report, report
    migrated = (tmp_path / "migrated" / "train.py").read_text()
    assert "gather" not in migrated
    original, _ = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, _ = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout and "epoch 1" in original.stdout
    two, _ = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    assert values(two.stdout, "center") == values(original.stdout, "center")


def test_gathered_evaluation_called_before_prepare_at_1_and_2_processes(tmp_path: Path) -> None:
    report = migrate(tmp_path, BASELINE_EVAL)
    assert "0 diagnostics" in report, report
    migrated = (tmp_path / "migrated" / "train.py").read_text()
    assert "correct, total = evaluate(net, accelerator.prepare_data_loader(loader))" in migrated
    original, _ = run_copy(tmp_path, "original", "train.py", 1, TIMEOUT)
    one, _ = run_copy(tmp_path, "migrated", "train.py", 1, TIMEOUT)
    assert original.stdout == one.stdout and re.search(r"^before \d+ 37$", original.stdout, re.MULTILINE)
    two, _ = run_copy(tmp_path, "migrated", "train.py", 2, TIMEOUT)
    # every sample counted once, before training too: the same weights, the same count as on 1 process
    before = re.search(r"^before \d+ \d+$", two.stdout, re.MULTILINE)
    assert before is not None, two.stdout
    assert before.group(0) == re.search(r"^before \d+ \d+$", original.stdout, re.MULTILINE).group(0)
    assert re.findall(r"^epoch (\d) \d+ (\d+)$", two.stdout, re.MULTILINE) == [("0", "37"), ("1", "37")]
