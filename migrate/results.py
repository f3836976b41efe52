"""What migrating one file produced: the new text, the changes made and the places left alone."""

from __future__ import annotations

from collections.abc import Iterable
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
    """A place a rule recognised but did not rewrite, with what the user should do.

    `unconverted`: the rule left training code unconverted there (the script does not train
    correctly on N processes until the user acts); set by the rule that reports it
    (`migrate.roles.model.Finding`). Otherwise the diagnostic is advice on code that is correct."""

    code: str
    line: int
    message: str
    severity: str = "warning"
    cell: int | None = None
    unconverted: bool = False


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

    @property
    def outcome(self) -> str:
        """What happened to the file's training code (`status` says what happened to its text):

        - migrated: changed, and no diagnostic says training code was left unconverted;
        - partial: changed, but a diagnostic says a part of the training code was left unconverted;
        - refused: not changed, and a diagnostic says training code was left as it is;
        - unchanged: parsed, nothing to change and nothing left unconverted (an already migrated
          script, a module without a training step, a test or library module: its diagnostics,
          if any, are advice);
        - no-training-code: not parsed (the pre-filter, or a `# accel-migrate: skip` header);
        - failed: could not be processed (unreadable, a syntax error, an internal error).
        """
        if self.error is not None:
            return "failed"
        left = any(d.unconverted for d in self.diagnostics)
        if self.changed:
            return "partial" if left else "migrated"
        if left:
            return "refused"
        return "unchanged" if self.parsed else "no-training-code"


# Every outcome, in the order reports list them.
OUTCOMES = ("migrated", "partial", "refused", "unchanged", "no-training-code", "failed")
# The outcomes that make `--check` (and `--diff`) exit 1 besides a pending change: training code
# the tool could not convert, as ruff exits 1 for violations it cannot fix.
NOT_CONVERTED = ("partial", "refused")


def combined_outcome(outcomes: Iterable[str]) -> str:
    """The outcome of several files taken as one (a repository): failed when one failed; else,
    when one was written, partial if any file's training code was left unconverted (partial, or
    refused beside the written ones), migrated otherwise; else refused, unchanged or
    no-training-code, the first that a file has in that order."""
    found = set(outcomes)
    if "failed" in found:
        return "failed"
    if found & {"migrated", "partial"}:
        return "partial" if found & set(NOT_CONVERTED) else "migrated"
    for outcome in ("refused", "unchanged"):
        if outcome in found:
            return outcome
    return "no-training-code"
