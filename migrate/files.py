"""Finding, reading and writing source files without ever damaging them.

Reading keeps what is needed to write the file back exactly as it was apart from the rewrite: its
encoding (PEP 263 cookie or UTF-8 BOM) and, since the text is decoded without newline translation,
its line endings. Writing is atomic (a temporary file in the same directory, then a rename) and
keeps the file mode, so an interrupted run never leaves a truncated file.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_EXCLUDES = frozenset(
    {".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "build", "dist", "site-packages",
     "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache", ".eggs"}
)


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str
    encoding: str


class UnreadableFile(Exception):
    """The file cannot be decoded as Python source."""


def discover(paths: Iterable[Path]) -> Iterator[Path]:
    """Explicit files as given; directories walked for *.py, skipping DEFAULT_EXCLUDES, sorted."""
    for path in paths:
        if path.is_dir():
            yield from _walk(path)
        else:
            yield path


def _walk(directory: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in DEFAULT_EXCLUDES and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root) / name


def read_source(path: Path) -> SourceFile:
    raw = path.read_bytes()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as error:
        raise UnreadableFile(f"cannot decode the file ({error}); save it as UTF-8") from error
    return SourceFile(path=path, text=text, encoding=encoding)


def write_atomic(source: SourceFile, new_text: str) -> None:
    data = new_text.encode(source.encoding)
    target = source.path
    mode = stat.S_IMODE(target.stat().st_mode)
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
