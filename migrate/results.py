"""What migrating one file produced: the new text, the changes made and the places left alone."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Change:
    """One rewrite a rule performed."""

    code: str
    line: int
    message: str


@dataclass(frozen=True)
class Diagnostic:
    """A place a rule recognised but did not rewrite, with what the user should do."""

    code: str
    line: int
    message: str
    severity: str = "warning"


@dataclass(frozen=True)
class FileError:
    """Why a file could not be processed (it is left untouched)."""

    line: int
    column: int
    message: str


@dataclass
class FileResult:
    path: str
    old_text: str
    new_text: str | None = None  # None: untouched
    changes: list[Change] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    error: FileError | None = None
    parsed: bool = False

    @property
    def changed(self) -> bool:
        return self.new_text is not None and self.new_text != self.old_text
