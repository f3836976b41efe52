"""Migrate a set of paths: discover, read, migrate, write. Returns results; never prints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from migrate.engine import Options, migrate_source
from migrate.files import UnreadableFile, discover, read_source, write_atomic
from migrate.results import FileError, FileResult


@dataclass
class Report:
    results: list[FileResult] = field(default_factory=list)

    @property
    def changed(self) -> list[FileResult]:
        return [r for r in self.results if r.changed]

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.results if r.error is not None]

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in self.results:
            for change in result.changes:
                counts[change.code] = counts.get(change.code, 0) + 1
        return dict(sorted(counts.items()))


def run(paths: Iterable[Path], options: Options, write: bool) -> Report:
    report = Report()
    for path in discover(paths):
        report.results.append(_migrate_file(path, options, write))
    return report


def _migrate_file(path: Path, options: Options, write: bool) -> FileResult:
    display = str(path)
    if not path.exists():
        return FileResult(display, "", error=FileError(0, 0, "no such file or directory"))
    try:
        source = read_source(path)
    except UnreadableFile as error:
        return FileResult(display, "", error=FileError(1, 1, str(error)))
    except OSError as error:
        return FileResult(display, "", error=FileError(0, 0, f"cannot read: {error.strerror}"))
    result = migrate_source(source.text, display, options)
    if write and result.changed and result.error is None:
        assert result.new_text is not None
        write_atomic(source, result.new_text)
    return result
