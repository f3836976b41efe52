"""The accel-migrate command line: exit codes, writing discipline and output."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PLAIN = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.in.py").read_text()
MIGRATED = (FIXTURES / "create_accelerator" / "device_ifexp_module_level.out.py").read_text()


def invoke(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(PLAIN)
    return path


def _snapshot(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def test_rewrites_in_place_and_exits_0(script: Path) -> None:
    result = invoke(str(script))
    assert result.exit_code == 0, result.output
    assert script.read_text() == MIGRATED
    assert "1 file migrated" in result.output
    assert invoke(str(script)).exit_code == 0  # nothing left to do


def test_check_writes_nothing_and_exits_1(script: Path) -> None:
    before = _snapshot(script)
    result = invoke("--check", str(script))
    assert result.exit_code == 1
    assert _snapshot(script) == before
    script.write_text(MIGRATED)
    assert invoke("--check", str(script)).exit_code == 0


def test_diff_prints_unified_diff_and_writes_nothing(script: Path) -> None:
    before = _snapshot(script)
    result = invoke("--diff", str(script), env={"NO_COLOR": ""})
    assert result.exit_code == 1
    assert _snapshot(script) == before
    assert f"--- {script}\t(original)" in result.stdout
    assert "+accelerator = Accelerator()" in result.stdout
    assert "-    loss.backward()" in result.stdout
    assert "\033[" not in result.stdout  # not a terminal: no colour


def test_diff_colour_can_be_forced(script: Path) -> None:
    result = invoke("--diff", str(script), env={"FORCE_COLOR": "1"})
    assert "\033[32m+accelerator = Accelerator()" in result.stdout


def test_syntax_error_reported_left_untouched_and_others_processed(tmp_path: Path, script: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_bytes(b"import torch\n\ndef f(:\n    loss.backward()\n")  # training code: parsed
    before = _snapshot(broken)
    result = invoke(str(broken), str(script))
    assert result.exit_code == 2
    assert f"{broken}:3:7: error: cannot parse" in result.output
    assert _snapshot(broken) == before
    assert script.read_text() == MIGRATED


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "nope.py"))
    assert result.exit_code == 2
    assert "nope.py: error: no such file or directory" in result.output


def test_file_without_torch_is_never_written(tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text("x = 1\ny = x.backward()\n")
    before = _snapshot(other)
    result = invoke(str(tmp_path))
    assert result.exit_code == 0
    assert _snapshot(other) == before


def test_directory_is_walked_recursively_skipping_virtualenvs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / ".venv").mkdir()
    inside = tmp_path / "pkg" / "train.py"
    venv_file = tmp_path / ".venv" / "train.py"
    inside.write_text(PLAIN)
    venv_file.write_text(PLAIN)
    result = invoke(str(tmp_path))
    assert result.exit_code == 0
    assert inside.read_text() == MIGRATED
    assert venv_file.read_text() == PLAIN


def test_crlf_bom_and_mode_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_bytes(b"\xef\xbb\xbf" + PLAIN.replace("\n", "\r\n").encode())
    path.chmod(0o750)
    assert invoke(str(path)).exit_code == 0
    data = path.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf")
    assert data[3:].decode() == MIGRATED.replace("\n", "\r\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o750


def test_coding_cookie_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    text = "# -*- coding: latin-1 -*-\n# caf\u00e9\n" + PLAIN
    path.write_bytes(text.encode("latin-1"))
    assert invoke(str(path)).exit_code == 0
    assert path.read_bytes().decode("latin-1").startswith("# -*- coding: latin-1 -*-\n# caf\u00e9\n")


def test_select_and_unknown_codes(script: Path) -> None:
    assert invoke("--select", "AM999", str(script)).exit_code == 2
    result = invoke("--select", "AM003,AM001", "--diff", str(script))  # alone, AM003 reads an accelerator nobody creates
    assert "+    accelerator.backward(loss)" in result.stdout
    assert "prepare(" not in result.stdout


def test_target_accelerate(script: Path) -> None:
    result = invoke("--target", "accelerate", "--diff", str(script))
    assert "+from accelerate import Accelerator" in result.stdout
    assert invoke("--target", "horovod", str(script)).exit_code == 2


def test_verbose_lists_changes_and_diagnostics_are_always_shown(tmp_path: Path, script: Path) -> None:
    result = invoke("-v", str(script))
    assert f"{script}:16: AM003 `.backward()` -> `accelerator.backward(...)`" in result.output
    library = tmp_path / "engine.py"
    library.write_text((FIXTURES / "replace_loss_backward" / "leave_library_function.in.py").read_text())
    result = invoke(str(library))
    assert f"{library}:9: AM003 warning:" in result.output


def test_version_and_help() -> None:
    assert invoke("--version").output.startswith("accel-migrate ")
    help_text = invoke("--help").output
    for option in ("--diff", "--check", "--target", "--select", "--ignore", "--verbose", "--quiet"):
        assert option in help_text


def test_cli_never_imports_torch_or_runtime(tmp_path: Path, script: Path) -> None:
    code = (
        "import sys\n"
        "from migrate.cli import main\n"
        f"sys.argv = ['accel-migrate', '--diff', {str(script)!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'runtime'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_internal_error_exits_123(monkeypatch: pytest.MonkeyPatch, script: Path) -> None:
    import migrate.runner

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(migrate.runner, "run", explode)
    result = invoke(str(script))
    assert result.exit_code == 123
    assert "please report" in result.output
