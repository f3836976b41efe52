"""Writing never loses a file: not one changed on disk while it was migrated, not on a full disk.

A change on disk between reading and writing is simulated by editing the file from inside the
migration (the engine call is wrapped); a full disk by a temporary file whose write stores part of
the data and then raises ENOSPC (or whose fsync does), as a real full disk does.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import migrate.files
import migrate.runner
from migrate.cli import app
from migrate.engine import Options
from migrate.files import FileChanged, read_source, write_atomic
from migrate.runner import Settings, process_file

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCRIPT = (FIXTURES / "scripts" / "train_mlp.py").read_text()
EDITED = SCRIPT.replace("lr=0.05", "lr=0.01")  # what an editor saved meanwhile


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["-j", "1", *args], env={"NO_COLOR": "1"})


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def edit_during_migration(monkeypatch: pytest.MonkeyPatch, victim: Path, new: bytes | None) -> None:
    """The migration of `victim` ends after someone saved `new` over it (None: deleted it)."""
    real = migrate.runner.migrate_text

    def migrate_then_edit(text, display, options, module=None):  # type: ignore[no-untyped-def]
        result = real(text, display, options, module)
        if Path(display) == victim:
            if new is None:
                victim.unlink()
            else:
                victim.write_bytes(new)
        return result

    monkeypatch.setattr(migrate.runner, "migrate_text", migrate_then_edit)


def test_a_file_changed_while_it_was_migrated_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim, other = tmp_path / "a_train.py", tmp_path / "b_train.py"
    victim.write_text(SCRIPT)
    other.write_text(SCRIPT)
    edit_during_migration(monkeypatch, victim, EDITED.encode())
    result = invoke(str(tmp_path))
    assert result.exit_code == 2, result.output
    assert victim.read_text() == EDITED  # the editor's save survives
    assert f"{victim}" in result.output and "changed on disk while it was being migrated" in result.output
    assert "run again" in result.output
    assert other.read_text() != SCRIPT and "Accelerator" in other.read_text()  # the other file is migrated
    assert leftovers(tmp_path) == []
    # running again migrates the edited file
    monkeypatch.undo()
    assert invoke(str(victim)).exit_code == 0
    assert "lr=0.01" in victim.read_text() and "Accelerator" in victim.read_text()


def test_a_file_deleted_while_it_was_migrated_is_not_recreated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "train.py"
    victim.write_text(SCRIPT)
    edit_during_migration(monkeypatch, victim, None)
    result = process_file(victim, Settings(options=Options()))
    assert result.error is not None and "removed while it was being migrated" in result.error.message
    assert result.written_to is None
    assert list(tmp_path.iterdir()) == []


def test_a_notebook_changed_while_it_was_migrated_is_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_notebooks import DATA, IMPORTS, MODEL, TRAIN, notebook_json

    victim = tmp_path / "train.ipynb"
    original = notebook_json([IMPORTS, DATA, MODEL, TRAIN])
    edited = notebook_json([IMPORTS, DATA, MODEL.replace("lr=0.1", "lr=0.2"), TRAIN])
    victim.write_text(original)
    edit_during_migration(monkeypatch, victim, edited.encode())
    result = invoke(str(victim))
    assert result.exit_code == 2, result.output
    assert victim.read_text() == edited
    assert "changed on disk while it was being migrated" in result.output
    assert leftovers(tmp_path) == []


def test_write_atomic_compares_the_bytes_on_disk_with_those_read(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_bytes(b"a = 1\n")
    source = read_source(path)
    path.write_bytes(b"a = 2\n")  # same size, maybe the same mtime: the bytes differ
    with pytest.raises(FileChanged):
        write_atomic(source, "a = 3\n")
    assert path.read_bytes() == b"a = 2\n" and leftovers(tmp_path) == []
    write_atomic(read_source(path), "a = 3\n")  # read again: written
    assert path.read_bytes() == b"a = 3\n"


class FullDisk:
    """A temporary file on a disk that fills up after `room` bytes: the write stores them, then ENOSPC."""

    def __init__(self, handle, room: int) -> None:  # type: ignore[no-untyped-def]
        self.handle, self.room = handle, room

    def write(self, data: bytes) -> int:
        self.handle.write(data[: self.room])
        self.handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.handle, name)

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


def fill_disk_for(monkeypatch: pytest.MonkeyPatch, name: str, room: int = 100) -> list[str]:
    """Writing a temporary file for `name` fails with ENOSPC after `room` bytes; returns the temp paths seen."""
    real_mkstemp, real_fdopen = migrate.files.tempfile.mkstemp, migrate.files.os.fdopen
    doomed: dict[int, str] = {}
    seen: list[str] = []

    def mkstemp(*args, **kwargs):  # type: ignore[no-untyped-def]
        fd, temp = real_mkstemp(*args, **kwargs)
        seen.append(temp)
        if Path(temp).name.startswith(f".{name}."):
            doomed[fd] = temp
        return fd, temp

    def fdopen(fd, *args, **kwargs):  # type: ignore[no-untyped-def]
        handle = real_fdopen(fd, *args, **kwargs)
        return FullDisk(handle, room) if doomed.pop(fd, None) else handle  # fd numbers are reused

    monkeypatch.setattr(migrate.files.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(migrate.files.os, "fdopen", fdopen)
    return seen


def test_a_full_disk_leaves_the_original_intact_and_the_other_files_processed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim, other = tmp_path / "a_train.py", tmp_path / "b_train.py"
    victim.write_text(SCRIPT)
    victim.chmod(0o751)
    other.write_text(SCRIPT)
    temps = fill_disk_for(monkeypatch, victim.name)
    result = invoke(str(tmp_path))
    assert result.exit_code == 2, result.output  # a per-file failure, not an internal error (123)
    assert victim.read_text() == SCRIPT and victim.stat().st_mode & 0o777 == 0o751
    assert f"{victim}" in result.output and "No space left on device" in result.output
    assert "left untouched" in result.output and "internal error" not in result.output
    assert any(Path(t).name.startswith(f".{victim.name}.") for t in temps)  # the doomed write did happen
    assert leftovers(tmp_path) == []  # its partial temporary file is removed
    assert "Accelerator" in other.read_text()


def test_a_full_disk_at_fsync_leaves_the_original_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "train.py"
    victim.write_text(SCRIPT)

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(migrate.files.os, "fsync", fsync)
    result = process_file(victim, Settings(options=Options()))
    assert result.error is not None and "No space left on device" in result.error.message
    assert result.traceback is None and result.written_to is None
    assert victim.read_text() == SCRIPT and leftovers(tmp_path) == []


def test_a_full_disk_while_writing_a_notebook_or_an_output_dir_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_notebooks import DATA, IMPORTS, MODEL, TRAIN, notebook_json

    source_dir, out = tmp_path / "src", tmp_path / "out"
    source_dir.mkdir()
    notebook, script = source_dir / "train.ipynb", source_dir / "train.py"
    original = notebook_json([IMPORTS, DATA, MODEL, TRAIN])
    notebook.write_text(original)
    script.write_text(SCRIPT)
    fill_disk_for(monkeypatch, notebook.name, room=10)
    result = invoke(str(notebook), str(script), "--output-dir", str(out))
    assert result.exit_code == 2, result.output
    assert "No space left on device" in result.output
    assert notebook.read_text() == original and script.read_text() == SCRIPT
    assert not (out / "train.ipynb").exists() and leftovers(out) == []
    assert "Accelerator" in (out / "train.py").read_text()
    payload = invoke(str(notebook), "--output-format", "json")  # in place, reported in every format
    assert payload.exit_code == 2
    (entry,) = json.loads(payload.stdout)["files"]
    assert entry["status"] == "failed" and "No space left on device" in entry["error"]["message"]
    assert notebook.read_text() == original and leftovers(source_dir) == []
