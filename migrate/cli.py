"""The `accel-migrate` command line: a thin layer over migrate.runner that only prints.

Exit codes: 0 nothing to change or all changes written; 1 changes would be made, or training code
was refused or left partly unconverted (--check or --diff); 2 a file could not be processed (the
others still are); 123 internal error.

Start-up matters (pre-commit runs this on every commit): this module imports only typer; libcst,
the engine, the rules and rich are imported when a run needs them, and the subcommands (rules,
explain, verify: migrate.subcommands) only when main() dispatches to one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

EXIT_OK, EXIT_WOULD_CHANGE, EXIT_FAILED, EXIT_INTERNAL = 0, 1, 2, 123
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for `git log | head`
PROGRESS_MIN_FILES = 8  # a progress bar only for more files than this, on a terminal
SUBCOMMANDS = ("rules", "explain", "verify")
# As black and ruff: paths without Python files are a warning, not an error (exit 0), so that a
# hook or CI step over a folder with no scripts yet passes.
def no_files(excluded: int) -> str:
    """The warning for a run that found no Python file (`excluded`: paths the excludes left out)."""
    left_out = f" ({excluded} path{'s' if excluded != 1 else ''} excluded)" if excluded else ""
    return f"accel-migrate: warning: no Python files (*.py, *.ipynb) found under the given paths{left_out}; nothing to do."

HELP = (
    "Rewrite single-device PyTorch training scripts to run distributed through an Accelerator.\n\n"
    "PATHS are files or directories (searched recursively for *.py and *.ipynb, honouring .gitignore "
    "and the excludes), or - to read a script from stdin and write the result to stdout. By default "
    "files are rewritten in place; use --diff to preview or --check in CI. Files that never mention "
    "torch are not parsed and never written. Settings are read from the tool.accel-migrate table of the "
    "nearest pyproject.toml; command-line options override them.\n\n"
    "Other commands: `accel-migrate rules` lists the rules, `accel-migrate explain CODE` documents "
    "one, `accel-migrate verify SCRIPT [-- ARGS]` runs a script and its migrated copy and compares their "
    "losses (it runs your code; see `accel-migrate verify --help`). A file named rules, explain or verify "
    "is migrated as ./rules.\n\n"
    "Exit codes: 0 nothing to change or changes written (also when no Python file is found: a "
    "warning); 1 changes would be made, or training code was refused or left partly unconverted "
    "(--check, --diff); "
    "2 a file could not be processed (the others still are), or a usage/configuration error; "
    "123 internal error (please report)."
)

# Plain (click-style) help, not rich panels: at 80 columns the panels squeeze each option's text
# into a narrow third column and cut words and option names short.
app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})


def _version(value: bool) -> None:
    if value:
        from migrate import __version__

        typer.echo(f"accel-migrate {__version__}")
        raise typer.Exit()


def _codes(values: Optional[list[str] | str]) -> frozenset[str]:
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    return frozenset(c.strip().upper() for value in values for c in value.split(",") if c.strip())


def _patterns(values: Optional[list[str]]) -> Optional[list[str]]:
    if values is None:
        return None
    return [p.strip() for value in values for p in value.split(",") if p.strip()]


class _PlainValues:
    """Typer's coercion of one parameter for the plain values this CLI declares (str, int with a
    minimum, Path, lists of them), without pydantic.

    typer coerces every non-bool parameter through a pydantic TypeAdapter, built on first use even
    for an option left unset: importing pydantic and building the adapters cost a plain run about
    55 ms before any file is read (`-X importtime`: typer._adapters -> pydantic, 60 ms; measured in
    the parent, so it is also serial time that -j2 cannot share). A value this class is not sure
    about (bytes, a sign or spaces in a number, a number under the minimum, an empty path, a bool
    flag's value: typer passes bools through itself, this sees only an unset --force-exclude) goes
    to typer's own coercion, so results and error messages are typer's.
    """

    def __init__(self, param) -> None:  # type: ignore[no-untyped-def]
        self.param = param
        self.annotation = param.type_descriptor.annotation
        self.info = param.type_descriptor.parameter_info
        self._typer = None

    def _slow(self):  # type: ignore[no-untyped-def]
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(self.param.type_descriptor)
        return self._typer

    def coerce(self, value, param, ctx):  # type: ignore[no-untyped-def]
        multi = param.multiple or param.nargs == -1
        if value is None:  # as typer: an unset option
            return () if multi else None
        if multi and isinstance(value, (list, tuple)):
            item_type = (getattr(self.annotation, "__args__", None) or (None,))[0]
            items = [self._one(item, item_type) for item in value]
            if _SLOW not in items:
                return [self._finish(item, item_type, param, ctx) for item in items]
        elif not multi:
            item = self._one(value, self.annotation)
            if item is not _SLOW:
                return self._finish(item, self.annotation, param, ctx)
        return self._slow().coerce(value, param=param, ctx=ctx)

    def _one(self, value, annotation):  # type: ignore[no-untyped-def]
        if not isinstance(value, str):
            return _SLOW
        if annotation is str:
            return value
        if annotation is int and value.isascii() and value.isdigit():
            number = int(value)
            low, high = self.info.min, self.info.max
            if (low is None or number >= low) and (high is None or number <= high) and not self.info.clamp:
                return number
            return _SLOW
        if annotation is Path and value and self.info.path_type is None:
            return Path(value)
        return _SLOW

    def _finish(self, item, annotation, param, ctx):  # type: ignore[no-untyped-def]
        if annotation is Path:  # typer's own checks (exists, readable, ...) on a Path
            from typer._param_types import coerce_cli_path

            return coerce_cli_path(item, self.info, path_type=Path, param=param, ctx=ctx)
        return item


_SLOW = object()


class ReadableHelp(typer.core.TyperCommand):
    """A command whose help reads well at 80 columns: each value is shown by its metavar alone.

    typer would add its type label after an argument's metavar (`PATHS <list[Path]>`), a range
    after an option's (`N [x>=1]`, said in the help text instead) and write a required argument
    as `{PATHS}` in the usage line; these hooks are typer's internals, so each is replaced only
    where it exists.
    """

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "option" and param.metavar is None and not getattr(param, "is_flag", False):
                # An option declared without a metavar is named after itself (`--seed SEED`), not its type.
                param.metavar = param.opts[-1].lstrip("-").replace("-", "_").upper() if param.opts else None
            if getattr(param, "metavar", None) is None:
                continue
            if param.param_type_name == "argument":
                if hasattr(param, "display_type_rich"):
                    param.display_type_rich = lambda ctx: None
                if hasattr(param, "_usage_display_name"):
                    param._usage_display_name = _usage_name(param)
            elif hasattr(param, "_get_number_range_help_str"):
                param._get_number_range_help_str = lambda: None


def _usage_name(param):  # type: ignore[no-untyped-def]
    """click's usage form: `PATHS...` when required, `[PATHS]...` when not (`[-- ARGS]` as written)."""
    if param.metavar.startswith("["):
        return lambda: param.metavar
    name = param.metavar if param.required else f"[{param.metavar}]"
    suffix = "..." if param.nargs != 1 and not param.metavar.endswith("...") else ""
    return lambda: name + suffix


class _Command(ReadableHelp):
    """The main command, its plain parameters coerced by _PlainValues (typer's internals permitting)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx):  # type: ignore[no-untyped-def]
        return _plain(super().get_help_option(ctx))


def _plain(param):  # type: ignore[no-untyped-def]
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or getattr(param, "_runtime_param", False) is not None:
        return param  # not the typer this was written for: leave typer's coercion alone
    if descriptor.file_annotation is None and descriptor.annotation in (bool, str, int, Path, list[str], list[Path]):
        param._runtime_param = _PlainValues(param)
    return param


@app.command(help=HELP, cls=_Command)
def migrate(
    paths: list[Path] = typer.Argument(
        ..., help="Files or directories to migrate, or - for stdin.", show_default=False, metavar="PATHS"
    ),
    diff: bool = typer.Option(False, "--diff", help="Print a unified diff of the changes and write nothing."),
    check: bool = typer.Option(
        False, "--check", help="Write nothing; exit 1 if any file would change or has training code refused or left partial."
    ),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        metavar="[runtime|accelerate]",
        help="Where Accelerator comes from: runtime (bundled, the default) or accelerate (HF).",
        show_default=False,
    ),
    select: Optional[str] = typer.Option(None, "--select", metavar="CODES", help="Only these rule codes, comma-separated."),
    ignore: Optional[str] = typer.Option(None, "--ignore", metavar="CODES", help="Skip these rule codes, comma-separated."),
    mixed_precision: Optional[str] = typer.Option(
        None, "--mixed-precision", metavar="[no|fp16|bf16]", help="Default precision for Accelerator(): no (default), fp16 or bf16."
    ),
    strategy: Optional[str] = typer.Option(
        None,
        "--strategy",
        metavar="[ddp|zero1|fsdp|fsdp-zero2]",
        help="Write Accelerator(strategy=...): ddp, zero1 (optimizer state sharded), fsdp (ZeRO-3-like), "
        "fsdp-zero2. A script that shards by hand keeps its own choice. Runtime target only.",
        show_default=False,
    ),
    output_dir: Optional[Path] = typer.Option(
        None,
        "--output-dir",
        metavar="DIR",
        help="Write migrated copies under this folder (mirroring the inputs' layout) instead of in place; "
        "only files that change are written.",
    ),
    force: bool = typer.Option(False, "--force", help="Allow an --output-dir that exists and is not empty."),
    exclude: Optional[list[str]] = typer.Option(
        None,
        "--exclude",
        metavar="PATTERNS",
        help="Gitignore-style patterns (comma-separated, repeatable) to skip in directories; replaces the "
        "defaults (.git, .venv, venv, build, dist, site-packages, __pycache__, ...).",
    ),
    extend_exclude: Optional[list[str]] = typer.Option(
        None, "--extend-exclude", metavar="PATTERNS", help="Patterns to skip in addition to the excludes."
    ),
    force_exclude: Optional[bool] = typer.Option(
        None, "--force-exclude/--no-force-exclude", help="Apply the excludes to files named explicitly too."
    ),
    jobs: Optional[int] = typer.Option(
        None, "--jobs", "-j", min=1, metavar="N", help="Worker processes, 1 or more (default: the number of CPUs).",
        show_default=False,
    ),
    output_format: Optional[str] = typer.Option(
        None, "--output-format", metavar="[text|json|github|sarif]", help="Report format: text (default), json, github or sarif (on stdout)."
    ),
    stdin_filename: Optional[str] = typer.Option(
        None, "--stdin-filename", metavar="NAME", help="The name of the file read from stdin, for messages and config matching."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", metavar="FILE", help="Read settings from this pyproject.toml instead of searching for one."
    ),
    annotate: bool = typer.Option(
        False, "--annotate", help="Also leave a `# TODO(accel-migrate): ...` comment above each diagnostic's line."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="List every change made, with its line."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only errors, the diff and the report."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    try:
        code = _main(
            paths,
            diff=diff,
            check=check,
            cli={
                "target": target,
                "select": select,
                "ignore": ignore,
                "mixed_precision": mixed_precision,
                "strategy": strategy,
                "annotate": annotate or None,
                "exclude": _patterns(exclude),
                "extend_exclude": _patterns(extend_exclude),
                "force_exclude": force_exclude,
                "jobs": jobs,
                "output_format": output_format,
            },
            output_dir=output_dir,
            force=force,
            stdin_filename=stdin_filename,
            config_path=config,
            verbose=verbose,
            quiet=quiet,
        )
    except typer.Exit:
        raise
    except BrokenPipeError:
        # The reader went away (`accel-migrate --diff . | head`): nothing is wrong, stop quietly.
        # Files are written before anything is reported, so a write run has finished by now.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except Exception:  # noqa: BLE001 - the contract is exit 123 with a report request
        typer.echo("accel-migrate: internal error; please report it with the file that triggered it.", err=True)
        if verbose:
            import traceback

            traceback.print_exc()
        else:
            typer.echo("Run again with --verbose for the traceback.", err=True)
        raise typer.Exit(EXIT_INTERNAL) from None
    raise typer.Exit(code)


def _build_options(target, select, ignore, mixed_precision="no", annotate=False, strategy=None):  # type: ignore[no-untyped-def]
    from migrate.config import MIXED_PRECISION, STRATEGIES, TARGETS
    from migrate.engine import Options

    known = _known_codes()
    target = target or "runtime"
    if target not in TARGETS:
        _fail_usage(f"--target must be one of {', '.join(TARGETS)}, not {target!r}")
    mixed_precision = mixed_precision or "no"
    if mixed_precision not in MIXED_PRECISION:
        _fail_usage(f"--mixed-precision must be one of {', '.join(MIXED_PRECISION)}, not {mixed_precision!r}")
    if strategy is not None and strategy not in STRATEGIES:
        _fail_usage(f"--strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    if strategy is not None and target != "runtime":
        _fail_usage("--strategy needs --target runtime: HF Accelerate's Accelerator has no strategy argument "
                    "(choose FSDP or DeepSpeed with `accelerate config` instead)")
    unknown = sorted((_codes(select) | _codes(ignore)) - known)
    if unknown:
        _fail_usage(f"unknown rule code(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return Options(
        target=target,
        select=_codes(select),
        ignore=_codes(ignore),
        mixed_precision=mixed_precision,
        annotate=bool(annotate),
        strategy=strategy,
    )


def _known_codes() -> set[str]:
    from migrate.registry import BY_CODE
    from migrate.runner import SHADOW_CODE
    from migrate.safety.registry import BY_CODE as CHECKS_BY_CODE

    from migrate.crossmodule import CODE as CROSSMODULE_CODE

    return {*BY_CODE, SHADOW_CODE, CROSSMODULE_CODE, *CHECKS_BY_CODE}  # `--ignore AM104` turns a safety check off


def options_from_flags(flags: list[str]):  # type: ignore[no-untyped-def]
    """Options from command-line flags, parsed by this CLI's own parser (for `# flags:` fixtures)."""
    command = typer.main.get_command(app)
    with command.make_context("accel-migrate", [*flags, "-"]) as context:
        params = context.params
    return _build_options(
        params["target"], params["select"], params["ignore"], params["mixed_precision"], params["annotate"],
        params["strategy"],
    )


def _fail_usage(message: str) -> None:
    typer.echo(f"accel-migrate: error: {message}", err=True)
    raise typer.Exit(EXIT_FAILED)


def _settings(cli: dict, config_path: Optional[Path], config_paths: list[Path]):  # type: ignore[no-untyped-def]
    """Command line over [tool.accel-migrate] over the defaults."""
    from migrate.config import OUTPUT_FORMATS, ConfigError, discover_config

    try:
        file_config = discover_config(config_paths, config_path)
    except ConfigError as error:
        _fail_usage(str(error))
        raise AssertionError from error  # unreachable: _fail_usage raises
    merged = dict(file_config.values)
    merged.update({key: value for key, value in cli.items() if value is not None})
    output_format = merged.get("output_format") or "text"
    if output_format not in OUTPUT_FORMATS:
        _fail_usage(f"--output-format must be one of {', '.join(OUTPUT_FORMATS)}, not {output_format!r}")
    merged["output_format"] = output_format
    patterns = list(merged.get("exclude") or []) + list(merged.get("extend_exclude") or [])
    if patterns:
        from migrate.discovery import pattern_error

        problem = pattern_error(patterns)
        if problem:
            where = f" (in {file_config.path})" if file_config.path is not None else ""
            _fail_usage(f"{problem}; fix it in --exclude/--extend-exclude or [tool.accel-migrate]{where}")
    return merged, file_config.root


def _main(
    paths: list[Path],
    *,
    diff: bool,
    check: bool,
    cli: dict,
    output_dir: Optional[Path],
    force: bool,
    stdin_filename: Optional[str],
    config_path: Optional[Path],
    verbose: bool,
    quiet: bool,
) -> int:
    stdin = [p for p in paths if str(p) == "-"]
    if stdin and len(paths) > 1:
        _fail_usage("- (stdin) cannot be combined with other paths")
    if stdin and output_dir is not None:
        _fail_usage("--output-dir cannot be used with - (stdin)")
    config_paths = [Path(stdin_filename)] if stdin and stdin_filename else [p for p in paths if str(p) != "-"]
    settings, root = _settings(cli, config_path, config_paths)
    options = _build_options(
        settings.get("target"),
        settings.get("select"),
        settings.get("ignore"),
        settings.get("mixed_precision"),
        settings.get("annotate"),
        settings.get("strategy"),
    )
    mode = "diff" if diff else "check" if check else "write"
    if stdin:
        return _run_stdin(stdin_filename or "-", options, settings, root, mode, verbose, quiet)

    from migrate import runner

    if output_dir is not None and mode == "write":
        problem = runner.check_output_dir(output_dir, paths, force)
        if problem:
            _fail_usage(problem)
    bar = _ProgressBar(enabled=not quiet and _is_terminal(sys.stderr))
    try:
        report = runner.run(
            paths,
            options,
            write=mode == "write",
            exclude=settings.get("exclude"),
            extend_exclude=settings.get("extend_exclude") or (),
            force_exclude=bool(settings.get("force_exclude")),
            root=root,
            output_dir=output_dir if mode == "write" else None,
            jobs=settings.get("jobs") or os.cpu_count() or 1,
            progress=bar.advance,
            on_start=bar.total,
        )
    finally:
        bar.stop()
    code = exit_code(report, mode)
    _report(report, mode, code, settings["output_format"], verbose, quiet)
    if not report.results and not quiet and settings["output_format"] in ("json", "sarif"):
        typer.echo(no_files(len(report.excluded)), err=True)  # the text report says it in place of its summary
    return code


def exit_code(report, mode: str) -> int:  # type: ignore[no-untyped-def]
    """123, 2, then (--check, --diff) 1 when a file would change or its training code was refused or
    left partly unconverted (as ruff exits 1 for violations it cannot fix). Writing exits 0 once
    done: its summary names the refused and partial files; --check is the gate."""
    if report.internal_errors:
        return EXIT_INTERNAL
    if report.failed:
        return EXIT_FAILED
    if mode != "write" and (report.changed or report.not_converted):
        return EXIT_WOULD_CHANGE
    return EXIT_OK


def _report(report, mode: str, code: int, output_format: str, verbose: bool, quiet: bool) -> None:  # type: ignore[no-untyped-def]
    from migrate import output
    from migrate.diff import colourize, result_diff

    write = mode == "write"
    if output_format == "json":
        sys.stdout.write(output.to_json(report, mode, code, with_diff=mode == "diff"))
    elif output_format == "sarif":
        sys.stdout.write(output.to_sarif(report, write, _rule_table(), code))
    else:
        colour_out, colour_err = _use_colour(sys.stdout), _use_colour(sys.stderr)
        for result in report.results:
            if mode == "diff" and result.changed:
                text = result_diff(result)
                sys.stdout.write(colourize(text) if colour_out else text)
            if output_format == "text":
                for style, line in output.text_lines(result, write, verbose, quiet):
                    typer.echo(_style(line, style) if colour_err else line, err=True, color=colour_err)
        if output_format == "github":
            sys.stdout.write(output.to_github(report, write))
        if not quiet:
            typer.echo(output.summary(report, write) if report.results else no_files(len(report.excluded)), err=True)
    if verbose:
        for result in report.internal_errors:
            typer.echo(f"{result.path}: internal error traceback:\n{result.traceback}", err=True)
    elif report.internal_errors:
        typer.echo("Internal error(s): please report them; run again with --verbose for the traceback.", err=True)


def _run_stdin(display: str, options, settings: dict, root, mode: str, verbose: bool, quiet: bool) -> int:  # type: ignore[no-untyped-def]
    from migrate import runner
    from migrate.diff import colourize, result_diff
    from migrate.discovery import discover

    data = sys.stdin.buffer.read()
    if display != "-" and settings.get("force_exclude"):
        found = discover(
            [Path(display)],
            settings.get("exclude"),
            settings.get("extend_exclude") or (),
            force_exclude=True,
            root=root,
            must_exist=False,
        )
        if found.excluded:  # as black does: an excluded file is echoed unchanged
            if mode == "write":
                sys.stdout.buffer.write(data)
            return EXIT_OK
    result, out = runner.migrate_stdin(data, display, options)
    report = runner.Report(results=[result])
    code = exit_code(report, mode)
    if mode == "write":
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    elif mode == "diff" and result.changed and settings["output_format"] in ("text", "github"):
        text = result_diff(result)
        sys.stdout.write(colourize(text) if _use_colour(sys.stdout) else text)
    from migrate import output

    fmt = settings["output_format"]
    stream = sys.stderr if mode == "write" else sys.stdout  # stdout carries the code in write mode
    if fmt == "json":
        stream.write(output.to_json(report, mode, code, with_diff=mode == "diff"))
    elif fmt == "sarif":
        stream.write(output.to_sarif(report, mode == "write", _rule_table(), code))
    elif fmt == "github":
        stream.write(output.to_github(report, mode == "write"))
    else:
        for style, line in output.text_lines(result, mode == "write", verbose, quiet):
            colour = _use_colour(sys.stderr)
            typer.echo(_style(line, style) if colour else line, err=True, color=colour)
    if verbose and result.traceback:
        typer.echo(result.traceback, err=True)
    return code


def _rule_table() -> list[tuple[str, str, str, str]]:
    from migrate.registry import documented_rules
    from migrate.runner import SHADOW_CODE, SHADOW_DOC

    from migrate.safety.registry import CHECKS

    table = [(r.code, r.name, r.summary, r.doc) for r in documented_rules()]
    table.append((SHADOW_CODE, "shadowed-runtime", SHADOW_DOC.strip().splitlines()[0], SHADOW_DOC))
    import migrate.crossmodule as crossmodule

    doc = crossmodule.__doc__ or ""
    table.append((crossmodule.CODE, crossmodule.NAME, doc.strip().splitlines()[0], doc))
    table += [(c.code, c.name, c.doc.strip().splitlines()[0], c.doc) for c in sorted(CHECKS, key=lambda c: c.code)]
    return table


_STYLES = {"error": "\033[31m", "warning": "\033[33m", "info": "\033[1m", "change": "\033[36m"}


def _style(line: str, style: str) -> str:
    return f"{_STYLES.get(style, '')}{line}\033[0m" if style in _STYLES else line


def _is_terminal(stream) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _use_colour(stream) -> bool:  # type: ignore[no-untyped-def]
    """NO_COLOR (https://no-color.org) wins, then FORCE_COLOR, then: only on a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return _is_terminal(stream)


class _ProgressBar:
    """A rich progress bar on stderr, for more than PROGRESS_MIN_FILES files on a terminal.

    Started at the first file done, not before: the runner submits every task to its process pool
    first, so the bar's refresh thread never exists while workers are forked.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.files = 0
        self._progress = None
        self._task = None

    def total(self, files: int) -> None:
        self.files = files

    @property
    def wanted(self) -> bool:
        return self.enabled and self.files > PROGRESS_MIN_FILES

    def advance(self, done: int) -> None:
        if not self.wanted:
            return
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("accel-migrate"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=sys.stderr),
                transient=True,
            )
            self._task = self._progress.add_task("files", total=self.files)
            self._progress.start()
        self._progress.advance(self._task, done)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """The subcommands live in migrate.subcommands (imported only when one runs); still reachable here."""
    if name in ("commands", "rules_command", "explain_command", "verify_command"):
        from migrate import subcommands

        return getattr(subcommands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[list[str]] = None) -> None:
    """`accel-migrate rules`, `accel-migrate explain CODE`, `accel-migrate verify SCRIPT [-- ARGS]`,
    else `accel-migrate [OPTIONS] PATHS...`.

    Dispatched here, before typer parses, so that PATHS keeps working as the default command.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None:  # this process is the command: a short-lived one
        _pause_collection()
    mistyped = _mistyped_subcommand(args)
    if mistyped is not None:
        typer.echo(f"accel-migrate: error: {mistyped}", err=True)
        raise SystemExit(EXIT_FAILED)
    try:
        if args and args[0] in SUBCOMMANDS:
            from migrate.subcommands import commands

            commands(args=args, prog_name="accel-migrate")
        else:
            app(args=args, prog_name="accel-migrate")
    finally:
        if argv is None:  # the process exits next (console script, python -m migrate)
            _skip_final_collection()


def _mistyped_subcommand(args: list[str]) -> Optional[str]:
    """The error for a first argument that is neither a path nor a subcommand but close to one
    (`accel-migrate explian`); None otherwise (a missing path is then the runner's error)."""
    if not args or args[0].startswith("-") or args[0] in SUBCOMMANDS or os.path.lexists(args[0]):
        return None
    import difflib

    close = difflib.get_close_matches(args[0], SUBCOMMANDS, n=1, cutoff=0.6)
    if not close:
        return None
    return f"{args[0]!r} is neither a file nor a command; did you mean `accel-migrate {close[0]}`?"


def _pause_collection() -> None:
    """Pause the cyclic garbage collector for the whole command: the runner then collects its
    young garbage only once it has piled up (`migrate.runner.COLLECT_AT`, about 50 MB), instead
    of after every unit, and the report's formatting pays no collection either."""
    import gc

    gc.disable()


def _skip_final_collection() -> None:
    """Freeze every object, so that the interpreter's last garbage collection at exit does not walk
    libcst and the run's results only to free memory the OS takes back anyway (about 40 ms after
    195 files: serial time at the end of every run, -j2 included)."""
    import gc

    gc.freeze()
