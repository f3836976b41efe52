"""Reading and writing source files without ever damaging them.

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
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    path: Path
    text: str
    encoding: str


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
    return SourceFile(path=path, text=text, encoding=encoding)


def write_atomic(source: SourceFile, new_text: str, target: Path | None = None) -> None:
    """Write new_text over source.path (or to target, creating its folders) with source's encoding and mode."""
    data = new_text.encode(source.encoding)
    mode = stat.S_IMODE(source.path.stat().st_mode)
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
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
