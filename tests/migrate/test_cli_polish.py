"""What a new user of accel-migrate meets first: help at 80 columns, typos, `explain` by name, no
Python files, and one set of counts in the text and JSON reports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from migrate import cli
from migrate.engine import migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"

# Type labels typer or click print in place of a value's name (`<bool>`, `<list[Path]>`,
# `<int range>`, `TEXT`, `INTEGER`), ranges (`[x>=1]`), rich's cut-off `…`, and a word or an
# option name broken at a hyphen at the end of a line.
PLACEHOLDER = re.compile(r"<[a-z][\w\[\], ]*>|\b(TEXT|INTEGER|FLOAT|BOOLEAN|PATH)\b|\[x[<>]=|…")
BROKEN_AT_HYPHEN = re.compile(r"(\w-|\s--?)\n")


def readable_at_80(text: str) -> None:
    assert text.strip(), "no help printed"
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, too_long
    assert not PLACEHOLDER.search(text), PLACEHOLDER.search(text)
    assert not BROKEN_AT_HYPHEN.search(text), BROKEN_AT_HYPHEN.search(text)


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code or 0, out, err


@pytest.mark.parametrize("command", [[], ["rules"], ["explain"], ["verify"]], ids=lambda c: " ".join(c) or "main")
def test_help_is_readable_at_80_columns(command: list[str], capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main([*command, "--help"], capsys)
    assert code == 0
    readable_at_80(out)
    assert "{" not in out.splitlines()[0]  # usage: `PATHS...`, not typer's `{PATHS}...`
    if not command:
        for value in ("--select CODES", "--output-dir DIR", "-j, --jobs N", "--target [runtime|accelerate]"):
            assert value in out, value


def test_mistyped_subcommand_suggests_the_right_one(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["explian", "AM003"], capsys)
    assert code == 2 and "did you mean `accel-migrate explain`?" in err, err
    code, _, err = run_main(["rulse"], capsys)
    assert code == 2 and "did you mean `accel-migrate rules`?" in err, err
    (tmp_path / "rulse").write_text("x = 1\n")  # an existing path is migrated, whatever its name
    code, _, err = run_main(["rulse"], capsys)
    assert code == 0 and "did you mean" not in err, err


def test_explain_accepts_a_code_a_rule_name_or_its_module_name(capsys) -> None:
    outputs = []
    for key in ("AM003", "am003", "replace-loss-backward", "replace_loss_backward"):
        code, out, _ = run_main(["explain", key], capsys)
        assert code == 0
        outputs.append(out)
    assert outputs[0].startswith("AM003 (replace-loss-backward)") and len(set(outputs)) == 1
    code, out, _ = run_main(["explain", "accelerator-bound"], capsys)  # a safety check too
    assert code == 0 and out.startswith("AM101 (accelerator-bound)")
    code, _, err = run_main(["explain", "replace-loss-backwrd"], capsys)
    assert code == 2 and "did you mean replace-loss-backward?" in err, err


def test_no_python_files_is_a_warning_and_exit_0(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("import torch\n")
    for folder in ("empty", "docs"):
        code, out, err = run_main([str(tmp_path / folder)], capsys)
        assert code == 0 and out == ""
        assert err.strip() == cli.no_files(0)
    code, out, err = run_main(["--output-format", "json", str(tmp_path / "empty")], capsys)
    assert code == 0 and json.loads(out)["summary"]["files"] == 0 and cli.no_files(0) in err
    code, out, err = run_main(["-q", str(tmp_path / "empty")], capsys)
    assert code == 0 and out == err == ""
    (tmp_path / "empty" / ".venv").mkdir()
    (tmp_path / "empty" / ".venv" / "train.py").write_text("import torch\n")
    code, out, err = run_main([str(tmp_path / "empty")], capsys)
    assert code == 0 and "(1 path excluded); nothing to do" in err, err


def test_text_and_json_summaries_count_the_same_files(tmp_path: Path, capsys) -> None:
    plain = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py").read_text()
    library = (FIXTURES / "replace_loss_backward" / "leave_library_function.in.py").read_text()
    for name, text in (("a.py", plain), ("b.py", "x = 1\n"), ("c.py", library), ("d.py", "import torch\ndef f(:\n"),
                       ("e.py", "import torch\ntorch.optim.SGD(\n"), (".venv/f.py", plain)):  # fmt: skip
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    _, out, _ = run_main(["--check", "--output-format", "json", str(tmp_path)], capsys)
    counts = json.loads(out)["summary"]
    _, _, err = run_main(["--check", str(tmp_path)], capsys)
    line, outcomes = err.strip().splitlines()[-2:]
    text = {
        "changed": r"(\d+) files? would be migrated", "unchanged": r"(\d+) unchanged",
        "skipped": r"(\d+) skipped", "failed": r"(\d+) failed", "diagnostics": r"(\d+) diagnostics?\b",
        "files": r"(\d+) files? seen", "excluded": r"(\d+) paths? excluded",
    }  # fmt: skip
    assert {key: int(re.search(pattern, line).group(1)) for key, pattern in text.items()} == {
        key: counts[key] for key in text
    }, line
    # Each file is counted once: a.py changed; c.py unchanged (diagnosed); b.py skipped; d.py
    # skipped too (no training code, so never parsed); e.py failed to parse; .venv excluded.
    assert (counts["changed"], counts["unchanged"], counts["skipped"], counts["failed"]) == (1, 1, 2, 1)
    assert counts["files"] == 5 and counts["excluded"] == 1
    # and the outcome line gives the same outcomes as the JSON: c.py's `.backward()` was left as it
    # is (no optimizer in the file to place the Accelerator by): refused
    assert outcomes.startswith("Outcomes: "), outcomes
    shown = re.findall(r"(\d+) ([a-z-]+)", re.sub(r"\([^)]*\)", "", outcomes).split(".")[0])
    assert {name: int(n) for n, name in shown} == {k: v for k, v in counts["outcomes"].items() if v}
    assert counts["outcomes"] == {"migrated": 1, "partial": 0, "refused": 1, "unchanged": 0, "no-training-code": 2,
                                  "failed": 1}
    assert "1 refused (" + str(tmp_path / "c.py") + ")" in outcomes


CLASS_BUILDS_OPTIMIZER = """
import torch
from torch.utils.data import DataLoader


class Trainer:
    def __init__(self, data):
        self.model = torch.nn.Linear(2, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.train_loader = DataLoader(data, batch_size=2)

    def fit(self):
        for x, y in self.train_loader:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()


if __name__ == "__main__":
    Trainer(torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4, 1))).fit()
"""


def test_explain_am004_describes_what_it_does_with_attributes(capsys) -> None:
    _, doc, _ = run_main(["explain", "AM004"], capsys)
    flat = " ".join(doc.split())
    what_it_does = flat.split("Why:")[0]
    assert "`self.model`, `self.optimizer`, `self.train_loader`) are prepared in that method" in what_it_does
    result = migrate_source(CLASS_BUILDS_OPTIMIZER, "trainer.py")
    assert (
        "self.model, self.optimizer, self.train_loader = self.accelerator.prepare(" in result.new_text
    ), result.new_text
    # Reported instead, as "Leaves alone" says: the class itself is the model ...
    module_model = CLASS_BUILDS_OPTIMIZER.replace("self.model.parameters()", "self.parameters()")
    assert "an optimizer over `self.parameters()`" in flat
    assert [d.code for d in migrate_source(module_model, "trainer.py").diagnostics] == ["AM004"]
    # ... or an attribute the class never sets.
    assert "an attribute the class never sets" in flat
    foreign = CLASS_BUILDS_OPTIMIZER.replace("        self.model = torch.nn.Linear(2, 1)\n", "")
    assert any(
        d.code == "AM004" and "`self.model` is not set" in d.message
        for d in migrate_source(foreign, "trainer.py").diagnostics
    )
