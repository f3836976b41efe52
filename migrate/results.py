"""What migrating one file produced: the new text, the changes made and the places left alone."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Change:
    """One rewrite a rule performed."""

    code: str
    line: int
    message: str
    cell: int | None = None  # notebooks: the cell (1-based position in the notebook); line is in it


@dataclass(frozen=True)
class Diagnostic:
    """A place a rule recognised but did not rewrite, with what the user should do."""

    code: str
    line: int
    message: str
    severity: str = "warning"
    cell: int | None = None


@dataclass(frozen=True)
class FileError:
    """Why a file could not be processed (it is left untouched)."""

    line: int
    column: int
    message: str
    cell: int | None = None


@dataclass
class FileResult:
    path: str
    old_text: str
    new_text: str | None = None  # None: untouched
    changes: list[Change] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error: FileError | None = None
    parsed: bool = False
    kind: str = "python"  # or "notebook"
    # notebooks: (label, old, new) for each changed cell, so diffs show cell numbers
    parts: list[tuple[str, str, str]] = field(default_factory=list)
    traceback: str | None = None  # an internal error (a bug): the traceback, for --verbose
    written_to: str | None = None  # where the new text was written (the file, or its --output-dir copy)

    @property
    def changed(self) -> bool:
        return self.new_text is not None and self.new_text != self.old_text

    @property
    def status(self) -> str:
        """changed, unchanged (parsed, nothing to do), skipped (not parsed: see migrate/prefilter.py) or failed."""
        if self.error is not None:
            return "failed"
        if self.changed:
            return "changed"
        return "unchanged" if self.parsed else "skipped"
