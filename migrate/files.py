"""Reading and writing source files without ever damaging them.

Reading keeps what is needed to write the file back exactly as it was apart from the rewrite: its
encoding (PEP 263 cookie or UTF-8 BOM), since the text is decoded without newline translation its
line endings, and the bytes read. Writing is atomic (a temporary file in the same directory, then
a rename) and keeps the file mode, so an interrupted run never leaves a truncated file:

- a failed write (a full disk, a quota, a read-only folder) raises `OSError` before the rename:
  the temporary file is removed and the original is as it was, bytes and mode;
- a file whose bytes on disk are no longer those that were read (an editor saved it, `git
  checkout` ran while the file was being migrated) is not overwritten: `FileChanged` is raised and
  the temporary file removed. The bytes are compared after the new text is on disk and right before
  the rename, so only a change in the microseconds between the two can still be lost.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str
    encoding: str
    raw: bytes | None = None  # the bytes read (None: not from a file); writing over path checks them


class FileChanged(Exception):
    """The file's bytes on disk changed between reading and writing: it was not overwritten."""


class UnreadableFile(Exception):
    """The file cannot be decoded as Python source."""


def read_source(path: Path) -> SourceFile:
    return decode_source(path.read_bytes(), path)


def decode_source(raw: bytes, path: Path) -> SourceFile:
    """Python: PEP 263 cookie or BOM, else UTF-8. Notebooks are JSON: UTF-8 (with or without BOM)."""
    try:
        if path.suffix == ".ipynb":
            encoding = "utf-8-sig" if raw.startswith(b"\xef\xbb\xbf") else "utf-8"
        else:
            encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        text = raw.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as error:
        raise UnreadableFile(f"cannot decode the file ({error}); save it as UTF-8") from error
    return SourceFile(path=path, text=text, encoding=encoding, raw=raw)


def write_atomic(source: SourceFile, new_text: str, target: Path | None = None) -> None:
    """Write new_text over source.path (or to target, creating its folders) with source's encoding and mode.

    Raises `FileChanged` (over source.path, when its bytes are no longer `source.raw`) or `OSError`
    (the write failed); either way nothing was replaced and no temporary file is left.
    """
    data = new_text.encode(source.encoding)
    in_place = target is None or target == source.path
    if target is None:
        target = source.path
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if in_place and source.raw is not None:
            _unchanged_since_read(source)
        os.chmod(temp_name, stat.S_IMODE(source.path.stat().st_mode))
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def _unchanged_since_read(source: SourceFile) -> None:
    try:
        current = source.path.read_bytes()
    except FileNotFoundError:
        raise FileChanged("removed while it was being migrated; it was not written back") from None
    if current != source.raw:
        raise FileChanged("changed on disk while it was being migrated, so it was not overwritten; run again")
