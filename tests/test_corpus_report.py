"""Smoke test of the corpus report (`python -m benchmarks corpus DIR`, benchmarks/corpus.py) on a
tiny synthetic corpus: one file unit migrated, one partial, one without training code, one with a syntax
error, one repo unit refused (a library module); and the unit discovery of a flat folder. Timings are never
asserted."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.corpus import recheck, units

ROOT = Path(__file__).resolve().parents[1]

TRAIN = """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)
model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

ENGINE = """\
import torch


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def _tree_digest(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_corpus_report_table_statuses_and_json(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "files").mkdir(parents=True)
    (corpus / "repos" / "proj").mkdir(parents=True)
    (corpus / "files" / "train.py").write_text(TRAIN)
    (corpus / "files" / "notes.py").write_text('print("no torch here")\n')
    # migrated, but no DataLoader feeds the step and torch is seeded alike on every process: every
    # process would train on the same data (AM004)
    (corpus / "files" / "partial.py").write_text(
        "import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Linear(4, 1)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    loss = model(torch.randn(8, 4)).sum()\n    optimizer.zero_grad()\n"
        "    loss.backward()\n    optimizer.step()\n")
    (corpus / "files" / "broken.py").write_text("import torch\noptimizer = torch.optim.SGD(\nloss.backward()\n")
    (corpus / "repos" / "proj" / "engine.py").write_text(ENGINE)
    (corpus / "repos" / "proj" / "utils.py").write_text("def average(v):\n    return sum(v) / len(v)\n")
    # parsed (it mentions torch and optim) but nothing to do or say
    (corpus / "repos" / "proj" / "helpers.py").write_text(
        'import torch\n\n\ndef zeros(n):\n    """For torch.optim tests."""\n    return torch.zeros(n)\n')
    before = _tree_digest(corpus)
    out_json = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks", "corpus", str(corpus), "--json", str(out_json),
                             "--details"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _tree_digest(corpus) == before  # the corpus itself is never written

    lines = result.stdout.splitlines()
    assert lines[0].startswith("| unit | status | changed/files | diagnostics by code | safety re-check |")
    rows = {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:] if line.startswith("| "))}
    assert list(rows) == ["files/broken.py", "files/notes.py", "files/partial.py", "files/train.py", "repos/proj"]
    assert rows["files/partial.py"][:3] == ["partial", "1/1", "AM004"]
    assert rows["files/broken.py"][:2] == ["failed", "0/1"]
    assert rows["files/train.py"][:5] == ["migrated", "1/1", "-", "pass", "yes"]
    assert rows["files/notes.py"][:5] == ["no-training-code", "0/1", "-", "-", "-"]
    assert rows["repos/proj"][:5] == ["refused", "0/3", "AM003", "-", "-"]
    [total] = [line for line in lines if line.startswith("5 units: ")]
    assert total.startswith("5 units: 1 migrated, 1 partial, 1 refused, 1 no-training-code, 1 failed.")
    assert "1 parsed files neither changed nor diagnosed" in total
    [reason] = [line for line in lines if line.startswith("- `repos/proj` (refused): ")]
    assert reason.startswith("- `repos/proj` (refused): engine.py:8 AM003 [left unconverted] `.backward()`")
    [partial] = [line for line in lines if line.startswith("- `files/partial.py` (partial): ")]
    assert "line 8 AM004 [left unconverted] no DataLoader feeds this training step" in partial
    assert reason.endswith("; parsed, neither changed nor diagnosed: helpers.py")
    details = lines[lines.index("Every diagnostic:"):]  # --details
    assert "- `repos/proj` (refused):" in details and any(line.startswith("  - engine.py:8 AM003") for line in details)

    report = json.loads(out_json.read_text())
    units = {u["unit"]: u for u in report["units"]}
    assert units["files/train.py"]["idempotent"] is True and units["files/train.py"]["safety_failures"] == []
    assert units["repos/proj"]["kind"] == "repo" and units["repos/proj"]["diagnostics"] == {"AM003": 1}
    assert units["repos/proj"]["file_status"] == {"engine.py": "unchanged", "helpers.py": "unchanged",
                                                  "utils.py": "skipped"}
    # the CLI's outcome of each file, the unit's status made from them
    assert units["repos/proj"]["file_outcomes"] == {"engine.py": "refused", "helpers.py": "unchanged",
                                                    "utils.py": "no-training-code"}
    assert units["files/partial.py"]["file_outcomes"] == {"partial.py": "partial"}


def test_recheck_reports_an_output_that_fails_a_safety_check() -> None:
    broken = TRAIN.replace("loss.backward()", "accelerator.backward(loss)")  # `accelerator` never bound
    failures = recheck("train.py", TRAIN, broken)
    assert failures and failures[0].startswith("train.py: AM101 accelerator-bound: output line 15:")
    assert recheck("train.py", TRAIN, TRAIN) == []
    assert recheck("train.py", TRAIN, "x = (\n")[0].startswith("train.py: AM103 parses:")


def test_units_of_a_flat_folder(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.ipynb").write_text("{}")
    (tmp_path / "README.md").write_text("")
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    found = [(u.name, u.is_dir) for u in units(tmp_path)]
    assert found == [("a.py", False), ("b.ipynb", False), ("proj", True)]


def test_corpus_report_verify_column(tmp_path: Path) -> None:
    """`--verify` (opt-in) runs `accel-migrate verify --synthetic` on each migrated unit: one that
    verifies, one whose data it cannot replace; the corpus itself is never written."""
    corpus = tmp_path / "corpus"
    (corpus / "files").mkdir(parents=True)
    (corpus / "files" / "train.py").write_text(TRAIN)
    reader = TRAIN.replace("data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))",
                           "values = open('data/x.bin', 'rb').read()\n"
                           "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))")
    (corpus / "files" / "reader.py").write_text(reader)
    before = _tree_digest(corpus)
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", "corpus", str(corpus), "--verify", "--verify-timeout", "120",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "| verify --synthetic |" in result.stdout
    assert "| files/train.py | migrated | 1/1 | - | pass | yes |" in result.stdout
    summary = next(line for line in result.stdout.splitlines() if line.startswith("verify --synthetic on "))
    assert summary.startswith("verify --synthetic on 2 migrated units: ") and "a verdict on 1/2" in summary
    assert "1 verified" in summary and "1 could not run" in summary
    assert "- `files/reader.py` (reader.py): could not run: reader.py:6: reads data through a loader" in result.stdout
    by_unit = {u["unit"]: u for u in json.loads(out.read_text())["units"]}
    assert by_unit["files/train.py"]["verify"] == "verified"
    assert by_unit["files/reader.py"]["verify"] == "could not run"
    assert "data/x.bin" in by_unit["files/reader.py"]["verify_error"]
    assert _tree_digest(corpus) == before


def test_corpus_report_verify_args(tmp_path: Path) -> None:
    """--verify-args gives a unit the arguments its script requires (what a user passes after
    `--`): without them argparse stops it (could not run); with them it runs to a verdict."""
    from benchmarks.corpus import UnitReport, Unit, read_verify_args, verify_unit

    script = tmp_path / "needs_args.py"
    script.write_text("import argparse\n" + TRAIN.replace(
        "import torch\n", "import torch\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--dataset', required=True)\nassert parser.parse_args().dataset == 'toy set'\n", 1))
    table = tmp_path / "args.tsv"
    table.write_text("# unit\targuments\n\nfiles/needs_args.py\t--dataset 'toy set'\n")
    assert read_verify_args(table) == {"files/needs_args.py": ["--dataset", "toy set"]}
    unit = Unit("files/needs_args.py", script, False)
    without, given = UnitReport(unit.name, "file", status="migrated"), UnitReport(unit.name, "file", status="migrated")
    verify_unit(unit, without, nproc=1, steps=2, timeout=120)
    assert without.verify == "could not run" and "the following arguments are required: --dataset" in without.verify_error
    verify_unit(unit, given, nproc=1, steps=2, timeout=120, args=read_verify_args(table))
    assert given.verify == "verified", given.verify_error
    assert given.verify_args == ["--dataset", "toy set"]
