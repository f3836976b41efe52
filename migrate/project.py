"""The module index of one run: which of the run's files import which, and what they define.

A repository's training is split over files: `main.py` builds the model and calls
`train_one_epoch` from `engine.py`, which calls helpers of `utils.py`. The index records, for the
Python files given in one run, the names each is importable as and the imports among them, resolved
as Python would: a plain `import engine` / `from engine import f` from the importing script's own
folder (the first entry of `sys.path` for `python main.py`) or from a package root (the folder
above the outermost package, a folder with `__init__.py`, that holds the file), unless that root
holds a script of the run besides and is not above the importer (another repository given in the
same run: `_on_path`); relative imports from the importing file's package. Imports of modules
outside the run are ignored.

A script and the files it reaches through such imports form a *unit* (`units()`; units sharing a
file are one): they are migrated together
(`migrate/crossmodule/`). A file that imports nothing of the run, and is imported by none, is a
unit of its own and goes through the single-file engine unchanged.

A name imported from a package that its `__init__.py` re-exports (`from data import build_loader`,
data/__init__.py: `from .build import build_loader`) is recorded as imported from the module
defining it (data/build.py), as Python binds it; so is one that a wrapper of the `__init__` only
hands the script's calls on to (`migrate/forwarding.py`).

Only scripts (files that mention `__main__`) and the files they import that mention `torch` (no
other file holds training code, see `migrate/prefilter.py`) take part (a package `__init__` is
read for its re-exports only), and a script reaching more
than `MAX_UNIT_FILES` files (a framework's own sources) is migrated on its own. Cost: the import
statements of each such file, found line by line and parsed alone (no parse of the whole file),
only in runs of several files; a run of one file builds no index.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from migrate.forwarding import forwarded


@dataclass
class ModuleInfo:
    path: Path  # absolute
    names: list[str] = field(default_factory=list)  # dotted names it is importable as
    imports: dict[Path, list["ImportedName"]] = field(default_factory=dict)  # run module -> what is taken
    has_main_guard: bool = False
    parse_error: bool = False
    # package `__init__` files whose re-exports were followed: not reached, but in the unit, so
    # that the unit's own index resolves the import the same way
    reexports: list[Path] = field(default_factory=list)
    # local name -> (package `__init__`, module defining the function): names whose calls a
    # wrapper of the package only hands on (`migrate/forwarding.py`), followed as re-exports
    forwarded: dict[str, tuple[Path, Path]] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportedName:
    """`from engine import train_one_epoch as step` -> ("train_one_epoch", "step", line);
    `import utils` -> (None, "utils", line): the module object itself."""

    name: str | None
    local: str
    line: int


@dataclass
class ModuleIndex:
    modules: dict[Path, ModuleInfo] = field(default_factory=dict)

    def importers(self, path: Path) -> list[Path]:
        """The run's files that import `path`."""
        return sorted(p for p, info in self.modules.items() if path in info.imports)

    def reached(self, entry: Path) -> list[Path]:
        """`entry`, then the run's modules it imports, transitively, in the order found."""
        order, seen = [entry], {entry}
        for path in order:
            for other in self.modules[path].imports:
                if other not in seen:
                    order.append(other)
                    seen.add(other)
        return order

    def units(self) -> list[list[Path]]:
        """Groups of files connected by imports, each sorted; singletons are files on their own."""
        parent: dict[Path, Path] = {p: p for p in self.modules}

        def find(p: Path) -> Path:
            while parent[p] != p:
                parent[p] = parent[parent[p]]
                p = parent[p]
            return p

        for entry, info in self.modules.items():
            if not (info.has_main_guard and info.imports):
                continue  # units form around scripts: modules are joined only through one
            reached = self.reached(entry)
            hubs = [h for path in reached for h in self.modules[path].reexports if h in parent]
            for other in [*reached[1:], *hubs]:
                a, b = find(entry), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        groups: dict[Path, list[Path]] = {}
        for path in self.modules:
            groups.setdefault(find(path), []).append(path)
        return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


MAX_UNIT_FILES = 64  # an entry reaching more of the run's files (a framework's own sources) stays on its own


def build_index(sources: dict[Path, str]) -> ModuleIndex:
    """The index of the given Python files (absolute paths -> text); notebooks are not modules.

    Only scripts (text with `__main__`) and, from them, the modules they import are parsed: a file
    no script of the run reaches joins no unit, and its imports are never read. A script reaching
    more than MAX_UNIT_FILES files keeps its imports unrecorded (it is migrated on its own)."""
    index = ModuleIndex()
    by_name: dict[str, list[Path]] = {}
    packages: dict[Path, bool] = {}  # folder -> holds an __init__.py (asked once per folder)
    for path in sources:
        info = ModuleInfo(path, names=_module_names(path, sources, packages))
        index.modules[path] = info
        for name in info.names:
            by_name.setdefault(name, []).append(path)
    # folders holding a script of the run: a package beside one is that script's project
    scripts = frozenset(path.parent for path, text in sources.items() if "__main__" in text)
    read: set[Path] = set()
    for entry, text in sources.items():
        if "__main__" not in text or "import" not in text:
            continue
        reached, seen = [entry], {entry}
        for path in reached:
            if path not in read:
                read.add(path)
                _read_imports(index.modules[path], sources[path], by_name, scripts)
            _follow_reexports(index.modules[path], index, sources, by_name, read, scripts)
            for other in index.modules[path].imports:
                if other not in seen and "torch" in sources[other]:
                    reached.append(other)
                    seen.add(other)
            if len(reached) > MAX_UNIT_FILES:
                index.modules[entry].imports.clear()
                break
    return index


def _follow_reexports(info: ModuleInfo, index: ModuleIndex, sources: dict[Path, str],
                      by_name: dict[str, list[Path]], read: set[Path], scripts: frozenset[Path]) -> None:
    """`from data import build_loader` where data/__init__.py only re-exports it (`from .build
    import build_loader`): the name is recorded as imported from the module that defines it, as
    Python binds it. A package `__init__` holds no training code of its own, so it is read for
    its imports even without `torch`; a name it defines itself (a wrapper) stays its own, unless
    every call the importer makes of it only dispatches to one name it imports
    (`migrate/forwarding.py`): then that name is followed, as for a re-export."""
    for target in [t for t in info.imports if t.name == "__init__.py"]:
        if target not in read:
            read.add(target)
            _read_imports(index.modules[target], sources[target], by_name, scripts, package=True)
        exported = {n.local: (module, n) for module, names in index.modules[target].imports.items()
                    for n in names if n.name is not None}
        kept: list[ImportedName] = []
        for name in info.imports[target]:
            found = exported.get(name.name) if name.name is not None else None
            if found is None and name.name is not None and f"def {name.name}" in sources[target]:
                via = forwarded(sources[target], name.name, sources[info.path], name.local)
                found = exported.get(via) if via is not None else None
                if found is not None:
                    info.forwarded[name.local] = (target, found[0])
            if found is None:
                kept.append(name)
                continue
            module, original = found
            if target not in info.reexports:
                info.reexports.append(target)
            info.imports.setdefault(module, []).append(ImportedName(original.name, name.local, name.line))
        if kept:
            info.imports[target] = kept
        else:
            del info.imports[target]


_IMPORT_START = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import[ \t]+\w)")
_MAIN_GUARD = re.compile(r"""^if[ \t]+(?:__name__[ \t]*==[ \t]*['"]__main__['"]|['"]__main__['"][ \t]*==[ \t]*__name__)""", re.M)


def _import_statements(text: str) -> Iterator[tuple[int, ast.stmt]]:
    """(line, statement) for each import statement of `text`, at any depth, found on the lines
    that start one (a parenthesised or continued import read to its end) and parsed alone: a
    whole-file parse and walk cost more than the rest of the index. A match inside a string is
    parsed like code; at worst it joins a file to a unit that migrates it as before."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not _IMPORT_START.match(line):
            continue
        start = index
        statement = line.strip()
        while (statement.count("(") > statement.count(")") or statement.endswith("\\")) and index < len(lines):
            statement = statement.rstrip("\\") + " " + lines[index].strip()
            index += 1
        try:
            tree = ast.parse(statement.split(";", 1)[0].split("#", 1)[0] if "(" not in statement else statement)
        except SyntaxError:
            continue
        if tree.body and isinstance(tree.body[0], (ast.Import, ast.ImportFrom)):
            yield start, tree.body[0]


def _read_imports(info: ModuleInfo, text: str, by_name: dict[str, list[Path]], scripts: frozenset[Path],
                  package: bool = False) -> None:
    path = info.path
    if "import" not in text or ("torch" not in text and "__main__" not in text and not package):
        return  # no training code (see migrate/prefilter.py) and not a script: it joins no unit
    info.has_main_guard = _MAIN_GUARD.search(text) is not None
    for line, node in _import_statements(text):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, path, by_name, scripts)
                if target is not None and target != path:
                    local = alias.asname or alias.name.split(".", 1)[0]
                    info.imports.setdefault(target, []).append(ImportedName(None, local, line))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, path, info)
            if base is None:
                continue
            for alias in node.names:
                # `from pkg import module` imports a module when one of that name is in the run
                submodule = _resolve(f"{base}.{alias.name}" if base else alias.name, path, by_name, scripts)
                local = alias.asname or alias.name
                if submodule is not None and submodule != path:
                    info.imports.setdefault(submodule, []).append(ImportedName(None, local, line))
                    continue
                target = _resolve(base, path, by_name, scripts) if base else None
                if target is not None and target != path and alias.name != "*":
                    info.imports.setdefault(target, []).append(ImportedName(alias.name, local, line))


def _module_names(path: Path, sources: dict[Path, str] | Iterable[Path], packages: dict[Path, bool]) -> list[str]:
    """`engine` for <dir>/engine.py (imported from its own folder); `pkg.sub.mod` for a file inside
    packages, from the folder above the outermost package; `pkg` for pkg/__init__.py."""
    parts = [path.stem] if path.name != "__init__.py" else []
    folder = path.parent
    names = [path.stem] if path.name != "__init__.py" else []
    while _cached_package(folder, sources, packages):
        parts.insert(0, folder.name)
        folder = folder.parent
        names.append(".".join(parts))
    return list(dict.fromkeys(n for n in names if n))


def _cached_package(folder: Path, sources: dict[Path, str] | Iterable[Path], packages: dict[Path, bool]) -> bool:
    if folder not in packages:
        packages[folder] = _is_package(folder, sources)
    return packages[folder]


def _is_package(folder: Path, sources: dict[Path, str] | Iterable[Path]) -> bool:
    init = folder / "__init__.py"
    return init in sources or os.path.isfile(init)


def _resolve(name: str, importer: Path, by_name: dict[str, list[Path]], scripts: frozenset[Path]) -> Path | None:
    """The run's file `name` refers to from `importer`: a module of the importer's own folder
    first (the script's folder), else the one package or package module of that dotted name that
    the importer's Python can find (`_on_path`)."""
    candidates = by_name.get(name, [])
    for candidate in candidates:
        if candidate.stem == name and candidate.name != "__init__.py" and candidate.parent == importer.parent:
            return candidate
    packaged = [c for c in candidates
                if ("." in name or c.name == "__init__.py") and _on_path(c, name, importer, scripts)]
    return packaged[0] if len(packaged) == 1 else None


def _on_path(candidate: Path, name: str, importer: Path, scripts: frozenset[Path]) -> bool:
    """`candidate` is importable as `name` from the folder its outermost package sits in (its
    root). The importer finds it when that root is the importer's own folder or one above it (the
    project's root: `python -m` from there, or `pip install -e .`), or when the package is
    installed from a folder of its own (`src/pkg` beside `scripts/train.py`). A root that holds a
    script of the run besides is another project, one more repository given in the same run
    (`a/main.py`'s `import models` is not `b/models/`, beside `b/main.py`)."""
    root = candidate.parents[name.count(".") + (candidate.name == "__init__.py")]
    return root == importer.parent or root in importer.parent.parents or root not in scripts


def _absolute(node: ast.ImportFrom, path: Path, info: ModuleInfo) -> str | None:
    """The dotted module a `from ... import` names, relative ones made absolute (None: unknown)."""
    if not node.level:
        return node.module or None
    packaged = [n for n in info.names if "." in n] or ([path.parent.name] if path.name == "__init__.py" else [])
    if not packaged:
        return None
    parts = packaged[-1].split(".")
    if path.name != "__init__.py":
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
    if not parts:
        return None
    return ".".join([*parts, *([node.module] if node.module else [])])


def local_imports(sources: dict[Path, str]) -> dict[Path, str]:
    """Files on disk, not among `sources`, that the scripts of `sources` reach through imports, as
    Python would find them (the script's folder, the package root above it, relative imports),
    with their text: read to follow a given script's training into them, never written.

    Only modules that mention `torch` are followed further (no other holds training code), plus
    the `__init__.py` of each package passed through (it may re-export a module's names). At most
    MAX_UNIT_FILES files: a script of a large framework keeps to what it was given."""
    found: dict[Path, str] = {}
    pending = [(path, text) for path, text in sources.items() if "__main__" in text and "import" in text]
    seen = {str(path) for path in sources}  # candidates are absolute path strings: a Path each costs more
    while pending and len(found) < MAX_UNIT_FILES:
        importer, text = pending.pop()
        for candidate in _import_candidates(importer, text):
            if candidate in seen:
                continue
            seen.add(candidate)
            if not os.path.isfile(candidate):
                continue
            try:
                with open(candidate, encoding="utf-8") as handle:
                    content = handle.read()
            except (OSError, UnicodeDecodeError):
                continue
            package = os.path.basename(candidate) == "__init__.py"
            if "torch" in content or package:
                found[Path(candidate)] = content
                if "torch" in content:
                    pending.append((Path(candidate), content))
    return found


def _import_candidates(importer: Path, text: str) -> Iterator[str]:
    """Files (absolute paths) that may hold what `importer` imports: `a.b` as a/b.py or
    a/b/__init__.py (with each package folder's __init__.py) under the importer's folder and its
    package root."""
    roots = [importer.parent]
    folder = importer.parent
    while os.path.isfile(folder / "__init__.py"):
        folder = folder.parent
    if folder != importer.parent:
        roots.append(folder)
    join, absolute = os.path.join, os.path.abspath
    for _, node in _import_statements(text):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            bases = roots
        elif node.level:
            base = importer.parent
            for _ in range(node.level - 1):
                base = base.parent
            prefix = node.module or ""
            names = [f"{prefix}.{a.name}".strip(".") for a in node.names] + ([prefix] if prefix else [])
            bases = [base]
        elif node.module is not None:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names if a.name != "*")]
            bases = roots
        else:
            continue
        for base in bases:
            folder = str(base)
            for name in names:
                parts = name.split(".")
                for depth in range(1, len(parts)):
                    yield absolute(join(folder, *parts[:depth], "__init__.py"))
                yield absolute(join(folder, *parts[:-1], parts[-1] + ".py"))
                yield absolute(join(folder, *parts, "__init__.py"))
