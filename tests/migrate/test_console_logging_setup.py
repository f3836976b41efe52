"""`logging.basicConfig(...)` at module level, above training code in functions (the accelerator is
created in one of them): console-only logging cannot be guarded there, but its only effect on N
processes is each log line printed N times, so it does not leave the file partial; a file-writing
setup (`filename=`, `handlers=`) still does."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from migrate.cli import app

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "guard_experiment_loggers"
           / "leave_console_logging_config_at_module_level.in.py").read_text()
CONSOLE = 'logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)'


def outcome(tmp_path: Path, text: str) -> tuple[str, list[tuple[str, bool]]]:
    path = tmp_path / "train.py"
    path.write_text(text)
    result = CliRunner().invoke(app, ["--check", "--output-format", "json", str(path)], env={"NO_COLOR": "1"})
    [entry] = json.loads(result.stdout)["files"]
    return entry["outcome"], [(d["code"], d["unconverted"]) for d in entry["diagnostics"]]


def test_console_logging_setup_at_module_level_is_a_note(tmp_path: Path) -> None:
    assert CONSOLE in FIXTURE
    assert outcome(tmp_path, FIXTURE) == ("migrated", [("AM012", False)])


def test_file_logging_setup_at_module_level_stays_unconverted(tmp_path: Path) -> None:
    for setup in ('logging.basicConfig(filename="train.log", level=logging.INFO)',
                  'logging.basicConfig(handlers=[logging.FileHandler("train.log")], level=logging.INFO)'):
        assert outcome(tmp_path, FIXTURE.replace(CONSOLE, setup)) == ("partial", [("AM012", True)])
