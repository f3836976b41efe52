"""Safety checks on the output of every file, run inside the engine before anything is written.

Each check is one module of this package, named by what it guarantees, exposing:

    CODE: str            stable code, reported as the diagnostic's code (AM1xx)
    NAME: str            kebab-case name
    def check(context: CheckContext) -> list[Violation]

and a module docstring (what it checks, why, what it cannot see). A check reads the migrated output
(`context.after`: the rules' rewritten tree, which is what a parse of the output gives, so the
output is not parsed again; see `fallback.output_tree`; shared by all checks) and, when it needs to, the
original (`context.before`). It returns the places where the output would run wrong; it never edits.

The engine (`migrate/engine.py`) runs every check in `CHECKS` order on each output that differs
from its input. When a check fails, the failing edits are not written: the engine falls back to
fewer edits that pass every check, or leaves the file as it is, and reports a diagnostic naming
the check and the line (mapped back to the input's line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst


@dataclass(frozen=True)
class Violation:
    """One place where the output fails a check."""

    line: int  # 1-based line in the OUTPUT text; the engine maps it back to the input
    message: str  # what would go wrong, and why the edit was not written
    rule: str | None = None  # the rule whose edit is at fault, when the check knows (else: nearest change)


@dataclass
class CheckContext:
    """What a check may read. `before`/`after` are parsed modules; texts are their code."""

    path: str
    before: cst.Module
    after: cst.Module
    before_text: str
    after_text: str
    options: object  # migrate.engine.Options (not imported here to avoid a cycle)
    # filled lazily by checks that need it and shared with the others (e.g. a metadata wrapper)
    cache: dict[str, object] = field(default_factory=dict)

    def line_of(self, node: cst.CSTNode) -> int:
        """The output line `node` (of `after`) starts on; 0 for a node not in `after`. Computed on
        first use (one code-generation pass, a third of libcst's PositionProvider), so a check that
        finds nothing pays nothing for positions."""
        lines = self.cache.get("after_start_lines")
        if lines is None:
            from migrate.positions import start_lines

            lines = self.cache["after_start_lines"] = start_lines(self.after)
        return lines.get(node, 0)  # type: ignore[attr-defined]


CheckFn = Callable[[CheckContext], list[Violation]]


@dataclass(frozen=True)
class Check:
    code: str
    name: str
    run: CheckFn
    doc: str


CHECKS: list[Check] = []  # filled in registration order by migrate/safety/registry.py
