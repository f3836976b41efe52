"""The module index of one run: which of the run's files import which, and what they define.

A repository's training is split over files: `main.py` builds the model and calls
`train_one_epoch` from `engine.py`, which calls helpers of `utils.py`. The index records, for the
Python files given in one run, the names each is importable as and the imports among them, resolved
as Python would: a plain `import engine` / `from engine import f` from the importing script's own
folder (the first entry of `sys.path` for `python main.py`) or from a package root (the folder
above the outermost package, a folder with `__init__.py`, that holds the file); relative imports
from the importing file's package. Imports of modules outside the run are ignored.

Files connected by such imports form a *unit* (`units()`): they are migrated together
(`migrate/crossmodule/`). A file that imports nothing of the run, and is imported by none, is a
unit of its own and goes through the single-file engine unchanged.

Only files that mention `torch` (no other file holds training code, see `migrate/prefilter.py`)
or `__main__` (a script: its training may be in the modules it imports) take part. Cost: one `ast` parse of each such file (the standard library parser,
about a tenth of libcst's), only in runs of several files; a run of one file builds no index.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ModuleInfo:
    path: Path  # absolute
    names: list[str] = field(default_factory=list)  # dotted names it is importable as
    imports: dict[Path, list["ImportedName"]] = field(default_factory=dict)  # run module -> what is taken
    has_main_guard: bool = False
    parse_error: bool = False


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

    def units(self) -> list[list[Path]]:
        """Groups of files connected by imports, each sorted; singletons are files on their own."""
        parent: dict[Path, Path] = {p: p for p in self.modules}

        def find(p: Path) -> Path:
            while parent[p] != p:
                parent[p] = parent[parent[p]]
                p = parent[p]
            return p

        for path, info in self.modules.items():
            for other in info.imports:
                a, b = find(path), find(other)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        groups: dict[Path, list[Path]] = {}
        for path in self.modules:
            groups.setdefault(find(path), []).append(path)
        return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def build_index(sources: dict[Path, str]) -> ModuleIndex:
    """The index of the given Python files (absolute paths -> text); notebooks are not modules."""
    index = ModuleIndex()
    by_name: dict[str, list[Path]] = {}
    for path in sources:
        info = ModuleInfo(path, names=_module_names(path, sources))
        index.modules[path] = info
        for name in info.names:
            by_name.setdefault(name, []).append(path)
    for path, text in sources.items():
        info = index.modules[path]
        if "import" not in text or ("torch" not in text and "__main__" not in text):
            continue  # no training code (see migrate/prefilter.py) and not a script: it joins no unit
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            info.parse_error = True  # the engine reports it; the file stays a unit of its own
            continue
        info.has_main_guard = any(_is_main_guard(stmt) for stmt in tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _resolve(alias.name, path, by_name)
                    if target is not None and target != path:
                        local = alias.asname or alias.name.split(".", 1)[0]
                        info.imports.setdefault(target, []).append(ImportedName(None, local, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, path, info)
                if base is None:
                    continue
                for alias in node.names:
                    # `from pkg import module` imports a module when one of that name is in the run
                    submodule = _resolve(f"{base}.{alias.name}" if base else alias.name, path, by_name)
                    local = alias.asname or alias.name
                    if submodule is not None and submodule != path:
                        info.imports.setdefault(submodule, []).append(ImportedName(None, local, node.lineno))
                        continue
                    target = _resolve(base, path, by_name) if base else None
                    if target is not None and target != path and alias.name != "*":
                        info.imports.setdefault(target, []).append(ImportedName(alias.name, local, node.lineno))
    return index


def _module_names(path: Path, sources: dict[Path, str] | Iterable[Path]) -> list[str]:
    """`engine` for <dir>/engine.py (imported from its own folder); `pkg.sub.mod` for a file inside
    packages, from the folder above the outermost package; `pkg` for pkg/__init__.py."""
    parts = [path.stem] if path.name != "__init__.py" else []
    folder = path.parent
    names = [path.stem] if path.name != "__init__.py" else []
    while _is_package(folder, sources):
        parts.insert(0, folder.name)
        folder = folder.parent
        names.append(".".join(parts))
    return list(dict.fromkeys(n for n in names if n))


def _is_package(folder: Path, sources: dict[Path, str] | Iterable[Path]) -> bool:
    init = folder / "__init__.py"
    return init in sources or os.path.isfile(init)


def _resolve(name: str, importer: Path, by_name: dict[str, list[Path]]) -> Path | None:
    """The run's file `name` refers to from `importer`: a module of the importer's own folder
    first (the script's folder), else the one package or package module of that dotted name."""
    candidates = by_name.get(name, [])
    for candidate in candidates:
        if candidate.parent == importer.parent and candidate.name != "__init__.py" and candidate.stem == name:
            return candidate
    packaged = [c for c in candidates if "." in name or c.name == "__init__.py"]
    return packaged[0] if len(packaged) == 1 else None


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


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)):
        return False
    test = stmt.test
    operands = [test.left, *test.comparators]
    return any(isinstance(o, ast.Name) and o.id == "__name__" for o in operands) and any(
        isinstance(o, ast.Constant) and o.value == "__main__" for o in operands
    )
