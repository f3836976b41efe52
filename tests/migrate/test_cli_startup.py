"""What keeps `accel-migrate` quick to start: what it imports, and that the shortcuts change nothing.

No timings here (they belong to benchmarks/): only which modules a run loads, and that the CLI's own
coercion of plain option values (migrate.cli._PlainValues, which spares typer's pydantic adapters)
gives exactly what typer's coercion gives, errors included.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer

import migrate.cli as cli

ROOT = Path(__file__).resolve().parents[2]

VECTORS = [
    ["x.py"],
    ["-"],
    ["a", "b", "c"],
    ["--check", "-j", "2", "d"],
    ["-j2", "d"],
    ["-j", "0", "d"],
    ["-j", "x", "d"],
    ["-j", "+2", "d"],
    ["-j", " 3", "d"],
    ["-j", "\u0663", "d"],
    ["-j", "1_0", "d"],
    ["-j", "-1", "d"],
    ["--jobs"],
    ["--output-dir", "", "d"],
    ["--output-dir", "out", "d"],
    ["--config", "/nonexistent/pyproject.toml", "d"],
    ["--exclude", "a,b", "--exclude", "c", "d"],
    ["--extend-exclude", "x", "d"],
    ["--force-exclude", "d"],
    ["--no-force-exclude", "d"],
    ["--target", "accelerate", "--select", "AM001", "--ignore", "AM002", "d"],
    ["--mixed-precision", "bf16", "--output-format", "json", "--stdin-filename", "t.py", "-"],
    ["--annotate", "-v", "-q", "--diff", "--force", "d"],
    [],
    ["", "d"],
    ["--bogus", "d"],
]


def _parse(argv: list[str]) -> tuple:
    command = typer.main.get_command(cli.app)
    try:
        with command.make_context("accel-migrate", list(argv)) as context:
            return "ok", {key: (type(value), value) for key, value in context.params.items()}
    except Exception as error:  # noqa: BLE001 - the error itself is what is compared
        return "error", type(error), str(error), getattr(error, "exit_code", None)


def test_plain_values_coerce_exactly_as_typer_does(monkeypatch: pytest.MonkeyPatch) -> None:
    command = typer.main.get_command(cli.app)
    assert any(isinstance(p._runtime_param, cli._PlainValues) for p in command.params)  # the shortcut is on
    ours = [_parse(argv) for argv in VECTORS]
    monkeypatch.setattr(cli, "_plain", lambda param: param)  # typer's own coercion (pydantic)
    assert not any(isinstance(p._runtime_param, cli._PlainValues) for p in typer.main.get_command(cli.app).params)
    theirs = [_parse(argv) for argv in VECTORS]
    for argv, mine, typers in zip(VECTORS, ours, theirs):
        assert mine == typers, argv


def _modules_after(argv: list[str], cwd: Path) -> set[str]:
    script = textwrap.dedent(
        f"""
        import sys
        from migrate.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        print("MODULES: " + " ".join(sorted(sys.modules)))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, check=True)
    return set(result.stdout.rsplit("MODULES: ", 1)[1].split())


def test_version_and_help_import_neither_libcst_nor_the_subcommands(tmp_path: Path) -> None:
    for argv in (["--version"], ["--help"]):
        loaded = _modules_after(argv, tmp_path)
        for module in ("libcst", "migrate.engine", "migrate.verify", "migrate.subcommands", "pathspec", "pydantic",
                       "torch", "runtime"):  # fmt: skip
            assert module not in loaded, (argv, module)


def test_a_run_imports_neither_pydantic_nor_torch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(1)\n")
    loaded = _modules_after(["--check", "-q", "-j", "1", str(tmp_path)], tmp_path)
    assert "migrate.engine" in loaded
    for module in ("pydantic", "torch", "runtime", "migrate.verify", "migrate.subcommands"):
        assert module not in loaded, module


def test_explicit_files_need_no_pattern_matching_unless_patterns_are_given(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.zeros(1)\n")
    assert "pathspec" not in _modules_after(["--check", "-q", "train.py"], tmp_path)  # as pre-commit runs it
    assert "pathspec" in _modules_after(["--check", "-q", "."], tmp_path)
    assert "pathspec" in _modules_after(["--check", "-q", "--extend-exclude", "x/", "train.py"], tmp_path)
