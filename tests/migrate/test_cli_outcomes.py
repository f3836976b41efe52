"""Each file's outcome (migrated, partial, refused, unchanged, no-training-code, failed): in the
text summary, the JSON report, and the exit code of --check and --diff (refused or partial training
code fails them, as ruff fails on violations it cannot fix; writing exits 0 once done)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app
from migrate.results import OUTCOMES, Diagnostic, FileResult, combined_outcome

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

# every piece converted: a DataLoader feeds the step
TRAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
batches = DataLoader(TensorDataset(torch.randn(48, 3), torch.randn(48, 1)), batch_size=12, shuffle=True)
net = torch.nn.Linear(3, 1).to(device)
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for inputs, targets in batches:
    inputs, targets = inputs.to(device), targets.to(device)
    loss = torch.nn.functional.mse_loss(net(inputs), targets)
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""
# written, but no DataLoader feeds the step: seeded alike, every process would train on the same
# data (AM004)
PARTIAL = """\
import torch

torch.manual_seed(0)
net = torch.nn.Linear(3, 1)
sgd = torch.optim.SGD(net.parameters(), lr=0.05)
for step in range(4):
    loss = net(torch.randn(6, 3)).pow(2).mean()
    sgd.zero_grad()
    loss.backward()
    sgd.step()
"""
# an `mp.spawn` launcher the tool cannot convert: left as it is (AM007)
REFUSED = (FIXTURES / "remove_distributed_boilerplate" / "leave_spawn_setup_helper_also_seeds.in.py").read_text()
# a test module: its training code is a test of training, left alone with advice (not a refusal)
TEST_MODULE = (FIXTURES / "whole_file" / "refused_ddp_test_case.in.py").read_text()
NO_TRAINING = "print('no torch here')\n"
BROKEN = "import torch\noptimizer = torch.optim.SGD(\n"


def invoke(*args: str, stdin: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), input=stdin, env={"NO_COLOR": "1"})


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_every_outcome_in_the_json_report_and_the_summary(tmp_path: Path) -> None:
    for name, text in (("a_train.py", TRAIN), ("b_partial.py", PARTIAL), ("c_spawn.py", REFUSED),
                       ("d_test_ddp.py", TEST_MODULE), ("e_notes.py", NO_TRAINING), ("f_broken.py", BROKEN)):
        write(tmp_path, name, text)
    result = invoke("--check", "--output-format", "json", str(tmp_path))
    document = json.loads(result.stdout)
    outcomes = {Path(f["path"]).name: f["outcome"] for f in document["files"]}
    assert outcomes == {"a_train.py": "migrated", "b_partial.py": "partial", "c_spawn.py": "refused",
                        "d_test_ddp.py": "unchanged", "e_notes.py": "no-training-code", "f_broken.py": "failed"}
    assert document["summary"]["outcomes"] == {name: 1 for name in OUTCOMES}
    files = {Path(f["path"]).name: f for f in document["files"]}
    # the outcome comes from what the rules say of their diagnostics, not from their text
    assert [d["code"] for d in files["b_partial.py"]["diagnostics"] if d["unconverted"]] == ["AM004"]
    assert [d["code"] for d in files["c_spawn.py"]["diagnostics"] if d["unconverted"]] == ["AM007"]
    assert files["d_test_ddp.py"]["diagnostics"] and not any(d["unconverted"] for d in files["d_test_ddp.py"]["diagnostics"])

    text = invoke("--check", str(tmp_path))
    [line] = [line for line in text.output.splitlines() if line.startswith("Outcomes: ")]
    assert line.startswith(
        f"Outcomes: 1 migrated, 1 partial ({tmp_path / 'b_partial.py'}), 1 refused ({tmp_path / 'c_spawn.py'}), "
        "1 unchanged, 1 no-training-code, 1 failed."
    ), line
    assert "fails --check and --diff (exit 1)" in line and "# accel-migrate: skip" in line


@pytest.mark.parametrize(
    ("text", "check", "written"),
    [
        (TRAIN, 1, True),  # would change
        (PARTIAL, 1, True),  # would change, and left partly unconverted
        (REFUSED, 1, False),  # nothing would change, but the training code was refused
        (TEST_MODULE, 0, False),  # advice only
        (NO_TRAINING, 0, False),
    ],
    ids=["migrated", "partial", "refused", "unchanged", "no-training-code"],
)
def test_check_and_diff_fail_on_refused_or_partial_and_writing_exits_0(
    tmp_path: Path, text: str, check: int, written: bool
) -> None:
    path = write(tmp_path, "train.py", text)
    assert invoke("--check", str(path)).exit_code == check
    diff = invoke("--diff", str(path))
    assert diff.exit_code == check  # --diff answers as --check
    assert ("+++ " in diff.stdout) == written  # a refusal has no diff: its exit code says it
    assert path.read_text() == text
    wrote = invoke(str(path))
    assert wrote.exit_code == 0, wrote.output
    assert (path.read_text() != text) == written


def test_writing_names_the_refused_and_partial_files(tmp_path: Path) -> None:
    partial = write(tmp_path, "partial.py", PARTIAL)
    refused = write(tmp_path, "spawn.py", REFUSED)
    result = invoke(str(tmp_path))
    assert result.exit_code == 0
    assert f"Outcomes: 1 partial ({partial}), 1 refused ({refused})." in result.output
    assert "fails --check" not in result.output  # said only where nothing is written
    # the partial file is migrated now: run again, its diagnostic is gone and --check passes it
    assert invoke("--check", str(partial)).exit_code == 0


def test_a_skip_comment_on_the_refusals_line_accepts_it(tmp_path: Path) -> None:
    path = write(tmp_path, "spawn.py", REFUSED)
    document = json.loads(invoke("--check", "--output-format", "json", str(path)).stdout)
    [line] = {d["line"] for d in document["files"][0]["diagnostics"] if d["unconverted"]}
    lines = REFUSED.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].rstrip("\n") + "  # accel-migrate: skip\n"
    path.write_text("".join(lines))
    accepted = invoke("--check", "--output-format", "json", str(path))
    assert accepted.exit_code == 0, accepted.stdout
    assert json.loads(accepted.stdout)["files"][0]["outcome"] == "unchanged"


def test_stdin_check_fails_on_a_refusal() -> None:
    assert invoke("--check", "-", stdin=REFUSED).exit_code == 1
    assert invoke("--check", "-", stdin=TEST_MODULE).exit_code == 0
    written = invoke("-", stdin=REFUSED)
    assert written.exit_code == 0 and written.stdout.startswith(REFUSED)  # echoed unchanged


def test_github_and_sarif_levels_follow_unconverted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "spawn.py", REFUSED)
    write(tmp_path, "test_ddp.py", TEST_MODULE)
    github = invoke("--check", "--output-format", "github", ".").stdout.splitlines()
    assert any(line.startswith("::error file=spawn.py,") and "accel-migrate AM007" in line for line in github)
    assert any(line.startswith("::warning file=test_ddp.py,") for line in github)
    assert not any(line.startswith("::error file=test_ddp.py,") for line in github)
    sarif = json.loads(invoke("--check", "--output-format", "sarif", ".").stdout)
    levels = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["level"])
              for r in sarif["runs"][0]["results"]}
    assert ("spawn.py", "error") in levels and ("test_ddp.py", "warning") in levels
    assert ("test_ddp.py", "error") not in levels


def _result(changed: bool, unconverted: bool | None, parsed: bool = True) -> FileResult:
    diagnostics = [] if unconverted is None else [Diagnostic("AM004", 3, "m", unconverted=unconverted)]
    return FileResult("x.py", "a", new_text="b" if changed else None, diagnostics=diagnostics, parsed=parsed)


def test_outcome_is_decided_by_the_unconverted_flag_and_the_change() -> None:
    assert _result(True, None).outcome == "migrated"
    assert _result(True, False).outcome == "migrated"  # advice beside a full conversion
    assert _result(True, True).outcome == "partial"
    assert _result(False, True).outcome == "refused"
    assert _result(False, False).outcome == "unchanged"
    assert _result(False, None, parsed=False).outcome == "no-training-code"


def test_combined_outcome_of_a_repository() -> None:
    assert combined_outcome(["migrated", "unchanged", "no-training-code"]) == "migrated"
    assert combined_outcome(["migrated", "refused"]) == "partial"  # a script of the unit left as it is
    assert combined_outcome(["partial", "unchanged"]) == "partial"
    assert combined_outcome(["refused", "unchanged"]) == "refused"
    assert combined_outcome(["unchanged", "no-training-code"]) == "unchanged"
    assert combined_outcome(["no-training-code"]) == "no-training-code"
    assert combined_outcome(["migrated", "failed"]) == "failed"
