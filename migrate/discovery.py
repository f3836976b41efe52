"""Which files a run processes: explicit files as given, directories walked like black and ruff do.

Directories are walked recursively for `*.py` and `*.ipynb`, honouring `.gitignore` files (those
from the git root, or the walked directory when there is no git repository, down to each file) and
the exclude patterns (gitignore syntax, matched against the path relative to the walked directory).
Explicitly named files are always processed unless `force_exclude` is set. The result is sorted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a pattern is first compiled: explicit files alone never need it
    import pathspec

SUFFIXES = (".py", ".ipynb")
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".venv/",
    "venv/",
    ".tox/",
    ".nox/",
    "build/",
    "dist/",
    "site-packages/",
    "__pycache__/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".eggs/",
    "*.egg-info/",
)


@dataclass
class Discovery:
    files: list[Path] = field(default_factory=list)  # sorted, unique
    excluded: list[Path] = field(default_factory=list)  # files and pruned directories, sorted
    missing: list[Path] = field(default_factory=list)  # named paths that do not exist


def _spec(patterns: Iterable[str]) -> pathspec.PathSpec:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(list(patterns))


def pattern_error(patterns: Iterable[str]) -> str | None:
    """What is wrong with the first pattern that is not valid gitignore syntax; None if all are."""
    for pattern in patterns:
        try:
            _spec([pattern])
        except ValueError as error:  # pathspec's pattern errors are ValueErrors
            return f"invalid exclude pattern {pattern!r} ({error}); patterns use .gitignore syntax"
    return None


def _lenient_spec(lines: list[str]) -> pathspec.PathSpec:
    """A .gitignore's patterns without the invalid lines, which git itself passes over."""
    try:
        return _spec(lines)
    except ValueError:
        return _spec(line for line in lines if pattern_error([line]) is None)


def _git_root(directory: Path) -> Path | None:
    for parent in (directory, *directory.parents):
        if (parent / ".git").exists():
            return parent
    return None


class _GitIgnores:
    """The .gitignore files that apply under a directory, deepest deciding (as git does)."""

    def __init__(self) -> None:
        self._cache: dict[Path, pathspec.PathSpec | None] = {}

    def _load(self, directory: Path) -> pathspec.PathSpec | None:
        if directory not in self._cache:
            path = directory / ".gitignore"
            spec = None
            if path.is_file():
                try:
                    spec = _lenient_spec(path.read_text(encoding="utf-8", errors="replace").splitlines())
                except OSError:
                    spec = None
            self._cache[directory] = spec
        return self._cache[directory]

    def ignored(self, path: Path, is_dir: bool, chain: list[Path]) -> bool:
        """`chain`: the directories from the top (git root) down to path's parent."""
        for directory in reversed(chain):
            spec = self._load(directory)
            if spec is None:
                continue
            relative = path.relative_to(directory).as_posix() + ("/" if is_dir else "")
            result = spec.check_file(relative)
            if result.include is not None:
                return bool(result.include)
        return False


def discover(
    paths: Iterable[Path],
    exclude: Iterable[str] | None = None,
    extend_exclude: Iterable[str] = (),
    force_exclude: bool = False,
    gitignore: bool = True,
    root: Path | None = None,
    must_exist: bool = True,
) -> Discovery:
    """`exclude` None: the defaults; `root` anchors exclude patterns for explicit files.

    `must_exist` False: a missing path is taken as a file (the name given with --stdin-filename).
    """
    patterns = list(DEFAULT_EXCLUDES if exclude is None else exclude) + list(extend_exclude)
    compiled: list[pathspec.PathSpec] = []

    def excludes() -> pathspec.PathSpec:
        if not compiled:
            compiled.append(_spec(patterns))
        return compiled[0]

    if exclude is not None or extend_exclude:
        excludes()  # the user's patterns: a bad one fails here, whatever the paths
    # else the defaults are compiled on first use (a directory, --force-exclude), so a run on
    # explicit files (pre-commit) never imports pathspec

    ignores = _GitIgnores()
    found = Discovery()
    files: set[Path] = set()
    for path in paths:
        if must_exist and not os.path.lexists(path):
            found.missing.append(path)
        elif path.is_dir():
            _walk(path, excludes(), ignores if gitignore else None, files, found)
        else:
            if force_exclude and _explicit_excluded(path, excludes(), root):
                found.excluded.append(path)
            else:
                files.add(path)
    found.files = sorted(files)
    found.excluded.sort()
    return found


def _explicit_excluded(path: Path, excludes: pathspec.PathSpec, root: Path | None) -> bool:
    absolute = Path(os.path.abspath(path))
    base = root if root is not None else Path.cwd()
    try:
        relative = absolute.relative_to(Path(os.path.abspath(base)))
    except ValueError:
        relative = Path(*absolute.parts[1:])
    # a file is excluded when it or one of its parent directories matches
    parts = relative.parts
    for i in range(1, len(parts)):
        if excludes.match_file(Path(*parts[:i]).as_posix() + "/"):
            return True
    return excludes.match_file(relative.as_posix())


def _walk(
    top: Path,
    excludes: pathspec.PathSpec,
    ignores: _GitIgnores | None,
    files: set[Path],
    found: Discovery,
) -> None:
    absolute_top = Path(os.path.abspath(top))
    chain_top: list[Path] = []
    if ignores is not None:
        git_root = _git_root(absolute_top)
        if git_root is not None and git_root != absolute_top:
            chain_top = _chain(git_root, absolute_top)[:-1]  # the walk adds absolute_top itself
    for root, dirs, names in os.walk(top):
        root_path = Path(root)
        absolute_root = Path(os.path.abspath(root))
        chain = chain_top + _chain(absolute_top, absolute_root) if ignores is not None else []
        relative_root = root_path.relative_to(top)
        kept = []
        for name in sorted(dirs):
            relative = (relative_root / name).as_posix() + "/"
            if excludes.match_file(relative) or (
                ignores is not None and ignores.ignored(absolute_root / name, True, chain)
            ):
                found.excluded.append(root_path / name)
            else:
                kept.append(name)
        dirs[:] = kept
        for name in sorted(names):
            if not name.endswith(SUFFIXES):
                continue
            relative = (relative_root / name).as_posix()
            if excludes.match_file(relative) or (
                ignores is not None and ignores.ignored(absolute_root / name, False, chain)
            ):
                found.excluded.append(root_path / name)
            else:
                files.add(root_path / name)


def _chain(top: Path, directory: Path) -> list[Path]:
    """Directories from top down to directory, both included."""
    relative = directory.relative_to(top)
    chain = [top]
    current = top
    for part in relative.parts:
        current = current / part
        chain.append(current)
    return chain
