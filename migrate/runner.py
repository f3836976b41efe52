"""Migrate a set of paths: discover, read, migrate, write. Returns results; never prints.

Files are processed in a process pool (`jobs` workers; in this process for one file or one job),
each worker reading, migrating and writing its own files. Results come back sorted by path, so the
output does not depend on the scheduling. A file is written only when a rule changed it, and only
over the bytes that were read (`migrate/files.py`); a failed write is that file's error, not the run's.
"""

from __future__ import annotations

import gc
import math
import os
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from migrate.discovery import discover
from migrate.files import (
    FileChanged,
    SourceFile,
    UnreadableFile,
    decode_source,
    read_source,
    write_atomic,
)
from migrate.results import NOT_CONVERTED, FileError, FileResult

SHADOW_CODE = "AM900"
SHADOW_DOC = """Warn when a migrated script's folder has its own `runtime.py` or `runtime/`.

What it does: after a file is migrated for `--target runtime`, looks for `runtime.py` or a
`runtime/` package next to it (where the converted copy is written, with `--output-dir`).
Why: `python train.py` puts the script's folder first on `sys.path`, so `from runtime import
Accelerator` would import that local module instead of the bundled runtime, and fail or misbehave.
Fix: rename the local module, or migrate with `--target accelerate`.
"""
_BUNDLED_RUNTIME = Path(__file__).resolve().parent.parent / "runtime"

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs to process one file (picklable)."""

    options: object  # migrate.engine.Options
    write: bool = True
    output_dir: Path | None = None
    base: Path | None = None  # input paths are mirrored under output_dir relative to this


@dataclass
class Report:
    results: list[FileResult] = field(default_factory=list)
    excluded: list[Path] = field(default_factory=list)

    @property
    def changed(self) -> list[FileResult]:
        return [r for r in self.results if r.changed]

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.results if r.error is not None]

    @property
    def not_converted(self) -> list[FileResult]:
        """Files whose training code was refused or left partly unconverted (`FileResult.outcome`)."""
        return [r for r in self.results if r.outcome in NOT_CONVERTED]

    @property
    def internal_errors(self) -> list[FileResult]:
        return [r for r in self.results if r.traceback is not None]

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def diagnostics(self) -> int:
        return sum(len(r.diagnostics) for r in self.results)

    def rule_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for result in self.results:
            for change in result.changes:
                counts[change.code] = counts.get(change.code, 0) + 1
        return dict(sorted(counts.items()))


def run(
    paths: Iterable[Path],
    options,  # type: ignore[no-untyped-def]
    write: bool,
    *,
    exclude: Iterable[str] | None = None,
    extend_exclude: Iterable[str] = (),
    force_exclude: bool = False,
    root: Path | None = None,
    output_dir: Path | None = None,
    jobs: int = 1,
    progress: Progress | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Report:
    """Discover the files under `paths` and migrate them; `on_start(n)` is told how many there are."""
    paths = list(paths)
    found = discover(paths, exclude, extend_exclude, force_exclude, root=root)
    base = output_base(paths) if output_dir is not None else None
    settings = Settings(options=options, write=write, output_dir=output_dir, base=base)
    report = Report(excluded=found.excluded)
    report.results = [
        FileResult(str(path), "", error=FileError(0, 0, "no such file or directory")) for path in found.missing
    ]
    if on_start is not None:
        on_start(len(found.files))
    report.results += _execute(_units(found.files), settings, jobs, progress)
    report.results.sort(key=lambda r: Path(r.path).parts)
    return report


def output_base(paths: list[Path]) -> Path:
    """The folder whose layout --output-dir mirrors: the common parent of the inputs."""
    from migrate.config import common_parent

    return common_parent(paths)


def check_output_dir(output_dir: Path, paths: list[Path], force: bool) -> str | None:
    """Why output_dir cannot be used (None: it can)."""
    out = Path(os.path.abspath(output_dir))
    for path in paths:
        absolute = Path(os.path.abspath(path))
        if path.is_dir() and (out == absolute or absolute in out.parents):
            return f"--output-dir {output_dir} is inside the input directory {path}; choose a folder outside it"
        if not path.is_dir() and out == absolute:
            return f"--output-dir {output_dir} is an input file"
    if out.exists() and not out.is_dir():
        return f"--output-dir {output_dir} exists and is not a directory"
    if out.is_dir() and any(out.iterdir()) and not force:
        return f"--output-dir {output_dir} exists and is not empty; use --force to write into it anyway"
    return None


@dataclass(frozen=True)
class Unit:
    """Files migrated together: `paths` were given (and may be written); `read` are modules the
    given scripts import that were not given, read only to follow the training into them."""

    paths: list[Path]
    read: dict[Path, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(map(_size, self.paths))


def _units(files: list[Path]) -> list[Unit]:
    """The run's files grouped into units: files connected by imports among them are migrated
    together (`migrate/project.py`, `migrate/crossmodule/`); every other file on its own. A script
    whose local imports were not given is joined by them, read only (`Unit.read`)."""
    modules = [p for p in files if p.suffix == ".py"]
    if not modules:
        return [Unit([p]) for p in files]
    from migrate.project import build_index, local_imports

    texts: dict[Path, str] = {}
    for path in modules:
        try:
            texts[Path(os.path.abspath(path))] = read_source(path).text
        except (UnreadableFile, OSError):
            continue  # reported when the file itself is processed
    companions = local_imports(texts)
    if len(texts) + len(companions) < 2:
        return [Unit([p]) for p in files]
    given = {Path(os.path.abspath(p)): p for p in modules}
    units: list[Unit] = []
    for group in build_index({**texts, **companions}).units():
        paths = [given[p] for p in group if p in given]
        if paths and len(group) > 1:
            units.append(Unit(paths, {p: companions[p] for p in group if p not in given}))
    grouped = {Path(os.path.abspath(p)) for unit in units for p in unit.paths}
    return units + [Unit([p]) for p in files if Path(os.path.abspath(p)) not in grouped]


def _execute(units: list[Unit], settings: Settings, jobs: int, progress: Progress | None) -> list[FileResult]:
    # Import the engine (libcst, the rules) before the pool forks, so that workers inherit it
    # instead of each importing it again; then freeze what is loaded: module objects are never
    # garbage, so no full collection (and, after fork, no worker's copy-on-write pages) pays for
    # walking them (-j2 over 585 fixture files: 25 ms less CPU per worker).
    import migrate.engine  # noqa: F401

    frozen = gc.get_freeze_count() == 0  # else someone else froze: leave it to them
    if frozen:
        gc.freeze()
    try:
        if jobs <= 1 or len(units) <= 1:
            results = []
            for unit in units:
                results.extend(_process_unit_uncollected(unit, settings))
                if progress is not None:
                    progress(len(unit.paths))
            return results
        return _execute_pool(units, settings, jobs, progress)
    finally:
        if frozen:
            gc.unfreeze()


def _execute_pool(units: list[Unit], settings: Settings, jobs: int, progress: Progress | None) -> list[FileResult]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # Largest units first, in small chunks: the last chunks are the quickest, so the workers finish
    # together (results are sorted by path afterwards, so the order of work is not seen).
    order = sorted(units, key=lambda unit: unit.size, reverse=True)
    size = max(1, min(8, math.ceil(len(order) / (jobs * 8))))
    chunks = [order[i : i + size] for i in range(0, len(order), size)]
    results = []
    # every task is submitted (and, with fork, every worker started) before the first progress
    # callback, so a progress display's thread never exists when a worker is forked
    with ProcessPoolExecutor(max_workers=min(jobs, len(chunks))) as pool:
        futures = {pool.submit(_process_chunk, chunk, settings): sum(len(u.paths) for u in chunk) for chunk in chunks}
        for future in as_completed(futures):
            results.extend(future.result())
            if progress is not None:
                progress(futures[future])
    return results


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _process_chunk(units: list[Unit], settings: Settings) -> list[FileResult]:
    return [result for unit in units for result in _process_unit_uncollected(unit, settings)]


# Young objects (GC-tracked allocations not yet freed) a process that paused the collector lets
# pile up before it collects them: about 50 MB of parse trees and analysis facts held by cycles.
COLLECT_AT = 1_000_000


def _process_unit_uncollected(unit: Unit, settings: Settings) -> list[FileResult]:
    """`process_unit` with the cyclic garbage collector paused, then one young-generation
    collection once the unit is done. A unit's parse trees are hundreds of thousands of objects
    that live until the unit ends and are freed by reference counting; the automatic collections
    walked them again and again while they were alive (about a tenth of a corpus run's CPU). The
    unit's own reference cycles (the analysis' scopes and their statements, recursive closures)
    wait for the collection at its end.

    A process that paused the collector itself (the CLI: `migrate.cli.main`) collects only once
    COLLECT_AT young objects have piled up: a run of a few hundred files then never walks its
    garbage (about 4% of the corpus run, for about 15 MB more memory), and a larger one still
    frees it in batches."""
    if not gc.isenabled():
        try:
            return process_unit(unit, settings)
        finally:
            if gc.get_count()[0] > COLLECT_AT:
                gc.collect(0)
    gc.disable()
    try:
        return process_unit(unit, settings)
    finally:
        gc.enable()
        gc.collect(0)


def process_unit(unit: Unit, settings: Settings) -> list[FileResult]:
    """One file as `process_file`; several files connected by imports migrated together, each
    written only when it changed (never raises). Files read but not given are never written: when
    the unit's training needs an edit in one of them, no file is, and the script is told to give
    them too (AM013)."""
    paths = unit.paths
    if len(paths) == 1 and not unit.read:
        return [process_file(paths[0], settings)]
    from migrate.crossmodule.unit import Source, migrate_unit, not_given
    from migrate.project import build_index

    read: dict[Path, SourceFile] = {}
    results: dict[Path, FileResult] = {}
    for path in paths:
        try:
            read[path] = read_source(path)
        except UnreadableFile as error:
            results[path] = FileResult(str(path), "", error=FileError(1, 1, str(error)))
        except OSError as error:
            results[path] = FileResult(str(path), "", error=FileError(0, 0, f"cannot read: {error.strerror}"))
    sources = [Source(Path(os.path.abspath(p)), str(p), s.text) for p, s in read.items()]
    companions = [Source(p, _shown(p), text) for p, text in unit.read.items()]
    try:
        index = build_index({s.path: s.text for s in (*sources, *companions)})
        migrated = migrate_unit([*sources, *companions], index, settings.options)
        if companions:
            migrated = not_given(migrated[: len(sources)], migrated[len(sources):], sources, companions, index, settings.options)
        for (path, source), result in zip(read.items(), migrated):
            target = _destination(path, settings)
            _check_shadowing(result, target.parent, settings.options)
            if settings.write and result.changed and result.error is None:
                _write(result, source, None if target == path else target)
            results[path] = result
    except Exception:  # noqa: BLE001 - a bug must not stop the other files; reported as exit 123
        for path, source in read.items():
            results[path] = _internal_error(str(path), source)
    return [results[p] for p in paths]


def _shown(path: Path) -> str:
    """A file that was not given, as the user would name it: relative to the working directory
    when inside it."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def process_file(path: Path, settings: Settings) -> FileResult:
    """Read, migrate and (when asked and a rule changed it) write one file; never raises."""
    display = str(path)
    try:
        source = read_source(path)
    except UnreadableFile as error:
        return FileResult(display, "", error=FileError(1, 1, str(error)))
    except OSError as error:
        return FileResult(display, "", error=FileError(0, 0, f"cannot read: {error.strerror}"))
    try:
        result = migrate_text(source.text, display, settings.options)
        target = _destination(path, settings)
        _check_shadowing(result, target.parent, settings.options)
        if settings.write and result.changed and result.error is None:
            assert result.new_text is not None
            _write(result, source, None if target == path else target)
    except Exception:  # noqa: BLE001 - a bug must not stop the other files; reported as exit 123
        return _internal_error(display, source)
    return result


def _write(result: FileResult, source: SourceFile, target: Path | None) -> None:
    """Write the new text; a file changed meanwhile or a failed write (disk full) is this file's error."""
    try:
        write_atomic(source, result.new_text or "", target)
    except FileChanged as error:
        result.error = FileError(0, 0, str(error))
    except OSError as error:
        where = f" {target}" if target is not None else ""
        reason = error.strerror or str(error)
        result.error = FileError(0, 0, f"cannot write{where}: {reason}; the file was left untouched")
    else:
        result.written_to = str(target or source.path)


def _destination(path: Path, settings: Settings) -> Path:
    if settings.output_dir is None or settings.base is None:
        return path
    relative = Path(os.path.abspath(path)).relative_to(settings.base)
    return settings.output_dir / relative


def _internal_error(display: str, source: SourceFile) -> FileResult:
    return FileResult(
        display,
        source.text,
        error=FileError(0, 0, "internal error while migrating this file; please report it with the file"),
        traceback=traceback.format_exc(),
    )


def migrate_text(text: str, display: str, options, module=None, facts=None) -> FileResult:  # type: ignore[no-untyped-def]
    """One file's text -> FileResult (pure). Notebooks (by name) are migrated as one script.
    `module`: a script's text already parsed (libcst), when the caller has it; `facts`: its analysis
    too (`migrate.engine.migrate_source`)."""
    if display.endswith(".ipynb"):
        return _migrate_notebook(text, display, options)
    from migrate.engine import migrate_source

    return _zero_touch(migrate_source(text, display, options, module, facts))


def _zero_touch(result: FileResult) -> FileResult:
    """A file no rule changed is never rewritten, whatever the round-trip produced."""
    if result.new_text is not None and not result.changes:
        result.new_text = None
    return result


def _migrate_notebook(text: str, display: str, options) -> FileResult:  # type: ignore[no-untyped-def]
    from migrate import notebooks
    from migrate.engine import mentions_torch, migrate_source

    result = FileResult(display, text, kind="notebook")
    if not mentions_torch(text):
        return result
    try:
        notebook = notebooks.load(text)
    except notebooks.NotPython:
        return result
    except notebooks.NotebookError as error:
        result.error = FileError(0, 0, str(error))
        return result
    inner = _zero_touch(migrate_source(notebook.script, display, options))
    result.parsed = inner.parsed

    def place(item):  # type: ignore[no-untyped-def]
        cell, line = notebooks.locate(notebook, item.line)
        return replace(item, line=line, cell=cell)

    result.changes = [place(c) for c in inner.changes]
    result.diagnostics = [place(d) for d in inner.diagnostics]
    if inner.error is not None:
        result.error = place(inner.error) if inner.error.line else inner.error
        return result
    if inner.new_text is None:
        return result
    try:
        sources = notebooks.split(notebook, inner.new_text)
    except notebooks.NotebookError as error:
        result.error = FileError(0, 0, str(error))
        return result
    result.parts = [
        (f"cell {index + 1}", notebook.texts[index], new)
        for index, new in sources.items()
        if new != notebook.texts[index]
    ]
    if result.parts:
        result.new_text = notebooks.dump(notebook, sources)
    return result


def _check_shadowing(result: FileResult, directory: Path, options) -> None:  # type: ignore[no-untyped-def]
    if not result.changed or getattr(options, "target", "runtime") != "runtime" or not options.enabled(SHADOW_CODE):
        return
    for name in ("runtime.py", "runtime"):
        candidate = directory / name
        if name == "runtime" and not candidate.is_dir():
            continue
        if not candidate.exists() or Path(os.path.abspath(candidate)).resolve() == _BUNDLED_RUNTIME:
            continue
        from migrate.results import Diagnostic

        result.diagnostics.append(
            Diagnostic(
                SHADOW_CODE,
                1,
                f"{candidate} would shadow the bundled runtime (`from runtime import Accelerator` would "
                "import it): rename it, or migrate with --target accelerate",
            )
        )
        return


def migrate_stdin(data: bytes, display: str, options) -> tuple[FileResult, bytes]:  # type: ignore[no-untyped-def]
    """Migrate a script given as bytes; returns the result and the bytes to print (the input when unchanged)."""
    try:
        source = decode_source(data, Path(display))
    except UnreadableFile as error:
        return FileResult(display, "", error=FileError(1, 1, str(error))), data
    try:
        result = migrate_text(source.text, display, options)
        if display != "-":  # with --stdin-filename: the folder the script lives in
            _check_shadowing(result, Path(display).parent, options)
    except Exception:  # noqa: BLE001
        return _internal_error(display, source), data
    if not result.changed or result.error is not None:
        return result, data
    assert result.new_text is not None
    return result, result.new_text.encode(source.encoding)
