"""`logging.basicConfig(...)` at module level, above training code in functions (the accelerator is
created in one of them): no Accelerator exists there, so the setup, console-only or writing a file
(`filename=`, `handlers=`), runs on the launcher's rank 0 (`RANK`) and the file is migrated with no
diagnostic."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from migrate.cli import app

FIXTURE = (Path(__file__).resolve().parents[2] / "fixtures" / "guard_experiment_loggers"
           / "guard_console_logging_config_at_module_level.in.py").read_text()
CONSOLE = 'logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)'


def outcome(tmp_path: Path, text: str) -> tuple[str, list[tuple[str, bool]], str]:
    path = tmp_path / "train.py"
    path.write_text(text)
    result = CliRunner().invoke(app, ["--check", "--output-format", "json", str(path)], env={"NO_COLOR": "1"})
    [entry] = json.loads(result.stdout)["files"]
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    written = CliRunner().invoke(app, ["--output-dir", str(out), str(path)], env={"NO_COLOR": "1"})
    assert written.exit_code == 0, written.stdout
    return entry["outcome"], [(d["code"], d["unconverted"]) for d in entry["diagnostics"]], (out / "train.py").read_text()


def test_console_logging_setup_at_module_level_runs_on_launcher_rank_0(tmp_path: Path) -> None:
    assert CONSOLE in FIXTURE
    result, diagnostics, migrated = outcome(tmp_path, FIXTURE)
    assert (result, diagnostics) == ("migrated", [])
    assert f'\nif int(environ.get("RANK", "0")) == 0:\n    {CONSOLE}\n' in migrated, migrated


def test_file_logging_setup_at_module_level_runs_on_launcher_rank_0(tmp_path: Path) -> None:
    for setup in ('logging.basicConfig(filename="train.log", level=logging.INFO)',
                  'logging.basicConfig(handlers=[logging.FileHandler("train.log")], level=logging.INFO)'):
        result, diagnostics, migrated = outcome(tmp_path, FIXTURE.replace(CONSOLE, setup))
        assert (result, diagnostics) == ("migrated", [])
        assert f'\nif int(environ.get("RANK", "0")) == 0:\n    {setup}\n' in migrated, migrated
