"""``accel launch --migrate SCRIPT``: run an unmodified single-device script on N processes.

Before any worker starts, the launcher migrates SCRIPT in this process (``migrate.runner``, the
engine ``accel-migrate`` runs, with the ``[tool.accel-migrate]`` settings of the script's
pyproject.toml; the target is always this runtime) into a new temporary folder, prints what the
migration changed and every diagnostic, and then either refuses or launches the copy.
The user's file is only read: never written, its mtime untouched.

What blocks the launch (exit status 2, the reasons printed, no worker started):

- the script cannot be migrated: a syntax error, an undecodable file, an internal error;
- **any diagnostic**. A diagnostic is, by the codemod's contract, a place a rule recognised but
  did not rewrite because it could not prove the rewrite right (a loader it cannot prepare, so
  every process would train on all the data; a per-rank value deciding an early stop, so the
  processes would take different paths and hang; a metric normalised by the per-process batch
  count; an edit dropped by a safety check, AM101-AM104). All diagnostics carry the severity
  ``warning`` today, and none of them is known to be harmless at N processes in every script,
  so none is waved through: a launcher that quietly ran a half-migrated script would give
  N wrong trainings that look like one right one;
- a ``runtime.py`` / ``runtime/`` next to the script: the copy's ``from runtime import
  Accelerator`` would import it (the script's folder is on ``sys.path``, see below);
- a script with no training code the codemod recognises (not parsed by its pre-filter: no
  optimizer and no ``.backward()``; or marked ``# accel-migrate: skip``): launched as it is, it
  would run N independent copies;
- a notebook (the workers run Python source).

A script the codemod parses and leaves unchanged without a diagnostic (already written for an
``Accelerator``) is launched as it is. To run a script despite its diagnostics, review
``accel-migrate --diff SCRIPT``, fix the script (``accel-migrate explain CODE`` says how), or
write the migrated copy with ``accel-migrate --output-dir DIR SCRIPT``, edit it, and launch that
with plain ``accel launch``.

How the copy runs: the workers start ``runtime/worker_entry.py --migrated COPY SCRIPT ARGS``,
which executes COPY's code as ``__main__`` with ``__file__`` and ``sys.argv[0]`` set to SCRIPT,
``sys.path`` starting with COPY's folder then SCRIPT's folder (sibling modules import as they
would from the original), and the launcher's working directory (relative data paths and
``Path(__file__).parent / ...`` both resolve as in ``python SCRIPT``). The temporary folder is
removed when the job succeeds; when it fails it is kept and named, because the traceback's line
numbers are the copy's.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

PREFIX = "accel launch --migrate"


class MigrationRefused(Exception):
    """The script must not be launched; the message says why and what to do."""


@dataclass(frozen=True)
class MigratedCopy:
    """The migrated copy of a script in its own temporary folder."""

    folder: Path
    copy: Path

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def migrate_for_launch(script: Path, err: TextIO) -> MigratedCopy | None:
    """Migrate ``script`` into a temporary folder, printing the changes and diagnostics to ``err``.

    Returns the copy to launch, or None when the script is to run as it is (nothing to migrate);
    raises ``MigrationRefused`` when it must not be launched (nothing is left on disk then).
    """
    from migrate import output, runner

    if script.suffix == ".ipynb":
        raise MigrationRefused(
            f"{script}: --migrate runs Python scripts, not notebooks; export it first "
            "(`jupyter nbconvert --to script`) or migrate it in place with `accel-migrate`"
        )
    options = _options(script)
    folder = Path(tempfile.mkdtemp(prefix="accel-launch-migrate-"))
    try:
        report = runner.run([script], options, write=True, output_dir=folder / "copy", jobs=1)
        result = report.results[0]
        if result.traceback is not None:
            raise MigrationRefused(
                f"{script}: internal error while migrating it; please report it with the file "
                f"(`accel-migrate --verbose {script}` prints the traceback)"
            )
        if result.error is not None:
            where = f"{script}:{result.error.line}" if result.error.line else str(script)
            raise MigrationRefused(f"{where}: cannot be migrated: {result.error.message}")
        if result.changed:
            counts = ", ".join(f"{code} x{n}" for code, n in report.rule_counts().items())
            err.write(f"{PREFIX}: {script}: {len(result.changes)} changes in a temporary copy ({counts}); "
                      f"`accel-migrate --diff {script}` shows them\n")
        for line in output.diagnostic_lines(result):
            err.write(line + "\n")
        if result.diagnostics:
            count = len(result.diagnostics)
            places = "1 place" if count == 1 else f"{count} places"
            first = min(d.code for d in result.diagnostics)
            raise MigrationRefused(
                f"{script}: not launched: the migration left {places} it could not rewrite safely (above), "
                "and the script would not train correctly on several processes as it is. Fix "
                f"{'it' if count == 1 else 'them'} in the script (`accel-migrate explain {first}` says how), or write "
                f"the copy with `accel-migrate --output-dir DIR {script}`, finish it by hand and launch it "
                "with `accel launch`"
            )
        if result.status == "skipped":
            raise MigrationRefused(
                f"{script}: not launched: it has no training code the migration recognises (no optimizer, no "
                "`.backward()`) or is marked `# accel-migrate: skip`, so it would run as N independent copies. "
                "If it trains in another module, "
                "migrate the folder with `accel-migrate`; if it is already written for an Accelerator or "
                "torch.distributed, launch it without --migrate"
            )
        if not result.changed:
            err.write(f"{PREFIX}: {script}: nothing to migrate; running it as it is\n")
            shutil.rmtree(folder, ignore_errors=True)
            return None
        copy = Path(result.written_to or "")
        if not copy.is_file():
            raise MigrationRefused(f"{script}: the migrated copy was not written ({copy})")
        return MigratedCopy(folder=folder, copy=copy)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _options(script: Path):  # type: ignore[no-untyped-def]
    """The rule selection of the script's ``[tool.accel-migrate]`` table; target always this runtime."""
    from migrate.config import ConfigError, discover_config
    from migrate.engine import Options

    try:
        values = discover_config([script]).values
    except ConfigError as error:
        raise MigrationRefused(f"{error}; fix the file or remove the table") from None

    def codes(name: str) -> frozenset[str]:
        return frozenset(code.upper() for code in values.get(name) or ())

    return Options(
        target="runtime",
        select=codes("select"),
        ignore=codes("ignore"),
        mixed_precision=values.get("mixed_precision") or "no",
    )
