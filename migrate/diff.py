"""Unified diffs of a migration, plain or coloured for a terminal."""

from __future__ import annotations

import difflib

_COLOURS = {"+": "\033[32m", "-": "\033[31m", "@": "\033[36m"}
_BOLD = "\033[1m"
_RESET = "\033[0m"


def unified_diff(path: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{path}\t(original)",
        tofile=f"{path}\t(migrated)",
    )
    out = []
    for line in lines:
        if not line.endswith(("\n", "\r")):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def result_diff(result) -> str:  # type: ignore[no-untyped-def]
    """The diff of one FileResult: the whole file, or a notebook's changed cells, each labelled."""
    if result.parts:
        return "".join(unified_diff(f"{result.path}:{label}", old, new) for label, old, new in result.parts)
    return unified_diff(result.path, result.old_text, result.new_text or "")


def colourize(diff: str) -> str:
    out = []
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            out.append(f"{_BOLD}{line.rstrip(chr(10))}{_RESET}\n")
        elif line[:1] in _COLOURS:
            out.append(f"{_COLOURS[line[:1]]}{line.rstrip(chr(10))}{_RESET}\n")
        else:
            out.append(line)
    return "".join(out)
