"""The `accel-migrate` command line: a thin layer over migrate.runner that only prints.

Exit codes: 0 nothing to change or all changes written; 1 changes would be made (--check or
--diff); 2 a file could not be processed (the others still are); 123 internal error.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_FAILED, EXIT_INTERNAL = 0, 1, 2, 123

HELP = (
    "Rewrite single-device PyTorch training scripts to run distributed through an Accelerator.\n\n"
    "PATHS are files or directories (searched recursively for *.py). By default files are rewritten "
    "in place; use --diff to preview or --check in CI. Files that never mention torch are not touched.\n\n"
    "Exit codes: 0 nothing to change or changes written; 1 changes would be made (--check, --diff); "
    "2 a file could not be processed (the others still are); 123 internal error (please report)."
)

app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"accel-migrate {version('accel-migrate')}")
        raise typer.Exit()


def _codes(value: Optional[str]) -> frozenset[str]:
    return frozenset(c.strip().upper() for c in (value or "").split(",") if c.strip())


@app.command(help=HELP)
def migrate(
    paths: list[Path] = typer.Argument(
        ..., help="Files or directories to migrate.", show_default=False, metavar="PATHS"
    ),
    diff: bool = typer.Option(False, "--diff", help="Print a unified diff of the changes and write nothing."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    target: str = typer.Option(
        "runtime", "--target", help="Where Accelerator comes from: runtime (bundled) or accelerate (HF)."
    ),
    select: Optional[str] = typer.Option(None, "--select", help="Only these rule codes, comma-separated."),
    ignore: Optional[str] = typer.Option(None, "--ignore", help="Skip these rule codes, comma-separated."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every change made, with its line."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors and the diff."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    options = _build_options(target, select, ignore)
    try:
        code = _run(paths, options, diff=diff, check=check, verbose=verbose, quiet=quiet)
    except Exception:  # noqa: BLE001 - the contract is exit 123 with a report request
        typer.echo("accel-migrate: internal error; please report it with the file that triggered it.", err=True)
        if verbose:
            traceback.print_exc()
        else:
            typer.echo("Run again with --verbose for the traceback.", err=True)
        raise typer.Exit(EXIT_INTERNAL) from None
    raise typer.Exit(code)


def _build_options(target: str, select: Optional[str], ignore: Optional[str]):  # type: ignore[no-untyped-def]
    from migrate.engine import TARGETS, Options
    from migrate.registry import BY_CODE

    if target not in TARGETS:
        _fail_usage(f"--target must be one of {', '.join(TARGETS)}, not {target!r}")
    unknown = sorted((_codes(select) | _codes(ignore)) - BY_CODE.keys())
    if unknown:
        _fail_usage(f"unknown rule code(s) {', '.join(unknown)}; known: {', '.join(sorted(BY_CODE))}")
    return Options(target=target, select=_codes(select), ignore=_codes(ignore))


def options_from_flags(flags: list[str]):  # type: ignore[no-untyped-def]
    """Options from command-line flags, parsed by this CLI's own parser (for `# flags:` fixtures)."""
    command = typer.main.get_command(app)
    with command.make_context("accel-migrate", [*flags, "-"]) as context:
        params = context.params
    return _build_options(params["target"], params["select"], params["ignore"])


def _fail_usage(message: str) -> None:
    typer.echo(f"accel-migrate: error: {message}", err=True)
    raise typer.Exit(EXIT_FAILED)


def _run(paths: list[Path], options, diff: bool, check: bool, verbose: bool, quiet: bool) -> int:  # type: ignore[no-untyped-def]
    from migrate import runner
    from migrate.diff import colourize, unified_diff

    write = not (diff or check)
    report = runner.run(paths, options, write=write)
    colour = _use_colour(sys.stdout)
    for result in report.results:
        if result.error is not None:
            where = f"{result.path}:{result.error.line}:{result.error.column}" if result.error.line else result.path
            typer.echo(f"{where}: error: {result.error.message}", err=True)
            continue
        if diff and result.changed:
            text = unified_diff(result.path, result.old_text, result.new_text or "")
            sys.stdout.write(colourize(text) if colour else text)
        if quiet:
            continue
        if result.changed:
            verb = "migrated" if write else "would migrate"
            typer.echo(f"{verb} {result.path}", err=True)
        if verbose:
            for change in result.changes:
                typer.echo(f"{result.path}:{change.line}: {change.code} {change.message}", err=True)
        for diagnostic in result.diagnostics:
            typer.echo(
                f"{result.path}:{diagnostic.line}: {diagnostic.code} {diagnostic.severity}: {diagnostic.message}",
                err=True,
            )
    if not quiet:
        typer.echo(_summary(report, write), err=True)
    if report.failed:
        return EXIT_FAILED
    if not write and report.changed:
        return EXIT_WOULD_CHANGE
    return EXIT_OK


def _summary(report, write: bool) -> str:  # type: ignore[no-untyped-def]
    changed = len(report.changed)
    failed = len(report.failed)
    unchanged = len(report.results) - changed - failed
    diagnostics = sum(len(r.diagnostics) for r in report.results)
    verb = "migrated" if write else "would be migrated"
    parts = [f"{changed} file{'s' if changed != 1 else ''} {verb}", f"{unchanged} unchanged"]
    if failed:
        parts.append(f"{failed} failed")
    line = ", ".join(parts) + f"; {diagnostics} diagnostic{'s' if diagnostics != 1 else ''}."
    counts = report.rule_counts()
    if counts:
        line += " Changes by rule: " + ", ".join(f"{code} x{n}" for code, n in counts.items()) + "."
    return line


def _use_colour(stream) -> bool:  # type: ignore[no-untyped-def]
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


def main() -> None:
    app()
