"""Every name the output reads is defined, and no import still in use was removed (AM104, names-defined).

What it checks:
    - Names: in every scope of the output (module, functions, lambdas, comprehensions, class
      bodies), each name it reads resolves as Python resolves it: a local of the scope (assigned,
      a parameter, imported, `del`-eted, bound by `for`/`with`/`except`/`:=`/`match`), a name of
      an enclosing function (`nonlocal` or free), a module-level binding (including a `global`
      assigned in a function), or a builtin. The compiler's own symbol tables decide this
      (`symtable`: scopes exactly as CPython builds them, in C, no second libcst pass).
    - Imports: a dotted module the input imported (`import torch.distributed`) that the output no
      longer imports, while the output still reads it as an attribute chain
      (`torch.distributed.barrier()`). A removed `import x` or `from m import x` whose `x` is still
      read is a name the output no longer defines (above).
    Only what the rewrite broke counts: a (scope, name) pair already undefined in the input (a
    user's bug, a name from `exec`, a notebook's `display`) is not reported, and neither is a name
    the input never read there. `accelerator` is AM101's (its bound-on-every-path check is
    stricter), unless AM101 is turned off.

Why:
    A rewrite that removes `import torch.distributed as dist` while one `dist.get_rank()` is left,
    drops the device binding that a helper still reads, or moves a statement out of the scope that
    defined what it reads, turns a working script into a NameError, often far into training.

What it cannot see:
    Order within a scope (a name read before its assignment; AM101 does that for `accelerator`),
    names from a star import (`from x import *`: then only names the input itself bound count),
    attributes of objects, and names defined in another module.
"""

from __future__ import annotations

import ast
import builtins
import re
import symtable
from collections import Counter

from migrate.safety import CheckContext, Violation

CODE = "AM104"
NAME = "names-defined"

_MODULE_NAMES = frozenset({
    "__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__", "__builtins__", "__path__",
    "__annotations__", "__cached__", "__debug__", "__dict__",
})
_BUILTINS = frozenset(dir(builtins)) | _MODULE_NAMES
_STAR = re.compile(r"\bimport\s*\*")
_IMPORT_LINE = re.compile(r"^[ \t]*import[ \t]+([^\n#;]+)", re.MULTILINE)
# The two patterns above, searched from their literal word: a pattern that starts with `\b` or `^`
# is tried at every position of the text (a whole-text scan in Python's `re`, most of what the
# import checks cost), one that starts with a literal is found by a fast literal search.
_STAR_WORD = re.compile(r"import\s*\*")
_IMPORT_WORD = re.compile("import")

Key = tuple[str, str]  # (scope path, name)


def check(context: CheckContext) -> list[Violation]:
    after = _Names(context.after_text, context.path)
    skip = frozenset() if "AM101" in getattr(context.options, "ignore", ()) else frozenset({"accelerator"})
    violations: list[Violation] = []
    if after.undefined:
        try:
            before = _Names(context.before_text, context.path)
        except SyntaxError:  # an input the compiler rejects: nothing to compare with
            return []
        new = after.undefined - before.undefined
        if after.star:  # any other name may come from the star import
            new = Counter({key: n for key, n in new.items() if key[1] in before.bound})
        new = Counter({key: n for key, n in new.items() if key[1] not in skip})
        if new:
            violations += _name_violations(context, new, before)
    violations += _import_violations(context)
    return sorted(violations, key=lambda v: v.line)


class _Names:
    """Module-level bindings and the (scope, name) reads that resolve to nothing, for one text."""

    def __init__(self, text: str, path: str) -> None:
        top = symtable.symtable(text, path, "exec")
        self.star = _star_import(text)
        self.bound: set[str] = set()
        self.imported: set[str] = set()
        self.undefined: Counter[Key] = Counter()
        reads: list[tuple[str, str]] = []
        stack = [(top, "")]
        while stack:
            table, prefix = stack.pop()
            path_ = f"{prefix}/{table.get_name()}" if prefix else table.get_name()
            module = table.get_type() == "module"
            # in a function only its globals can be read from or bound at module level (a name
            # declared `global` is one of them); its locals are not looked up one by one
            symbols = ([table.lookup(name) for name in table.get_globals()] if isinstance(table, symtable.Function)
                       else table.get_symbols())
            for symbol in symbols:
                name = symbol.get_name()
                if module:
                    if symbol.is_assigned() or symbol.is_imported():
                        self.bound.add(name)
                    if symbol.is_imported():
                        self.imported.add(name)
                elif symbol.is_declared_global() and (symbol.is_assigned() or symbol.is_imported()):
                    self.bound.add(name)
                if symbol.is_referenced() and symbol.is_global() and name not in _BUILTINS:
                    reads.append((path_, name))
            stack.extend((child, path_) for child in table.get_children())
        for key in reads:
            if key[1] not in self.bound:
                self.undefined[key] += 1


def _star_import(text: str) -> bool:
    """`_STAR.search(text) is not None`: each `import *` is checked for the word boundary before it."""
    return any(_STAR.match(text, found.start()) for found in _STAR_WORD.finditer(text))


def _import_lines(text: str) -> list[re.Match[str]]:
    """`list(_IMPORT_LINE.finditer(text))`: a match lies within one line and starts at its start,
    so it is looked for only at the start of each line holding the word `import`."""
    matches = []
    last = -1
    for word in _IMPORT_WORD.finditer(text):
        start = text.rfind("\n", 0, word.start()) + 1
        if start != last:
            last = start
            match = _IMPORT_LINE.match(text, start)
            if match is not None:
                matches.append(match)
    return matches


def _name_violations(context: CheckContext, new: Counter[Key], before: _Names) -> list[Violation]:
    lines = _read_lines(context.after_text, {name for _, name in new})
    violations = []
    for (scope, name) in sorted(new):
        where = "" if scope == "top" else f" in `{scope.removeprefix('top/').replace('/', '.')}`"
        why = " (its import was removed)" if name in before.imported else ""
        line = next((n for s, n in lines.get(name, []) if s == scope), None) or next(
            (n for _, n in lines.get(name, [])), 0
        )
        violations.append(Violation(line, (
            f"`{name}` is read{where} but the output no longer defines it{why}: a NameError when this line runs"
        )))
    return violations


def _read_lines(text: str, names: set[str]) -> dict[str, list[tuple[str, int]]]:
    """name -> (symtable-style scope path, line) of each read, for the few names that failed."""
    found: dict[str, list[tuple[str, int]]] = {}
    kinds = {ast.ListComp: "listcomp", ast.SetComp: "setcomp", ast.DictComp: "dictcomp",
             ast.GeneratorExp: "genexpr", ast.Lambda: "lambda"}

    def visit(node: ast.AST, scope: str) -> None:
        if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
            found.setdefault(node.id, []).append((scope, node.lineno))
        inner = scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}/{node.name}"
        elif type(node) in kinds:
            inner = f"{scope}/{kinds[type(node)]}"
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(text), "top")
    return found


def _loaded_modules(text: str, aliased: bool) -> set[str]:
    """Dotted modules the text's `import a.b.c` statements load (a.b.c and a.b; a plain name is the
    name check's). `import a.b as x` loads a.b too but binds only `x`: counted only with `aliased`.
    `from a.b import c` is not counted: what it binds is a name, and whether `a.b` stays reachable
    through `a` without it depends on `a` itself (`import torch` loads `torch.nn`)."""
    loaded: set[str] = set()
    for match in _import_lines(text):
        parts = match.group(1).replace("(", " ").replace(")", " ").replace("\\", " ").split(",")
        for part in parts:
            words = part.split()
            if not words or (not aliased and "as" in words):
                continue
            names = words[0].split(".")
            for end in range(2, len(names) + 1):
                if all(names[:end]):
                    loaded.add(".".join(names[:end]))
    return loaded


def _import_violations(context: CheckContext) -> list[Violation]:
    before_text, after_text = context.before_text, context.after_text
    loaded = _loaded_modules(after_text, aliased=True)
    removed = _loaded_modules(before_text, aliased=False) - loaded
    violations = []
    for dotted in sorted(removed):
        if any(other.startswith(dotted + ".") for other in loaded):
            continue
        if dotted not in after_text or not re.search(rf"(?<![\w.]){re.escape(dotted)}\b", after_text):
            continue
        line = _attribute_line(after_text, dotted)
        if line:
            violations.append(Violation(line, (
                f"the import of `{dotted}` was removed but `{dotted}` is still used here: an AttributeError "
                "unless something else happens to import it"
            )))
    return violations


def _attribute_line(text: str, dotted: str) -> int:
    """The first line where code (not a string or comment) reads the attribute chain `dotted`."""
    parts = dotted.split(".")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _chain(node) == parts:
            return node.lineno
    return 0


def _chain(node: ast.expr) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(names)]
