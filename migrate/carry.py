"""The comments and blank lines of a removed statement, carried to the statement kept after it.

The rewrite (`rewriter.py`) and the cleanup of unused names (`cleanup.py`) remove statements; the
README promises that every comment is kept. A removed statement's leading lines (its comments and
the blank lines between them) and every comment inside it (a trailing comment, the comments of a
removed `if`'s body, a comment inside a call's parentheses) go to the next statement kept in the
same block, above its own leading lines, or to the block's footer when nothing follows. Where the
two meet, the longer of the two runs of blank lines is kept (not their sum), so removing a
statement set apart by blank lines leaves one gap, not two; a block that now starts with the next
statement does not start with a blank line the removed one did not have.

A trailing pragma (`# noqa`, `# type: ignore`, `# pylint: ...`, `# fmt: ...`, `# nosec`,
`# pragma: ...`) is the one comment dropped with its line: it applies to that line only, and on a
line of its own it would mean something else (`# pylint: disable=...` alone disables a check for
the rest of the scope, `# fmt: off` turns the formatter off).

The comments are found in source order without libcst's `CSTNode.children`, which rebuilds the node
(and validates it) to list them: each node type's fields are read in the order its own
`_visit_and_replace_children` visits them (`visit_*(self, "field", ...)`, read once from its source);
a type whose order cannot be read so falls back to `children`. tests/migrate/test_comments.py checks
that the two agree on every node of every fixture.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Sequence

import libcst as cst

from migrate.walk import NOT_NODES, fields_getter

_PRAGMA = re.compile(r"#\s*(noqa\b|type:\s*ignore|pylint:|fmt:|nosec\b|pragma:|pyright:|mypy:)")


def is_pragma(comment: str) -> bool:
    return _PRAGMA.match(comment) is not None


def lines_of(stmt: cst.BaseStatement) -> list[cst.EmptyLine]:
    """What a removed `stmt` leaves: its leading lines, then every other comment inside it, each
    on a line of its own (trailing pragmas excepted)."""
    lines = list(stmt.leading_lines)
    own = {id(line.comment) for line in lines if line.comment is not None}
    found: list[tuple[cst.Comment, bool]] = []
    _comments(stmt, found, trailing=False)
    for comment, trailing in found:
        if id(comment) in own or (trailing and is_pragma(comment.value)):
            continue
        lines.append(cst.EmptyLine(comment=comment))
    return lines


def comments_in(node: cst.CSTNode) -> list[str]:
    """The text of every comment under `node`, in source order."""
    found: list[tuple[cst.Comment, bool]] = []
    _comments(node, found, trailing=False)
    return [comment.value for comment, _ in found]


def _comments(node: cst.CSTNode, found: list[tuple[cst.Comment, bool]], trailing: bool) -> None:
    kind = type(node)
    if kind is cst.Comment:
        found.append((node, trailing))  # type: ignore[arg-type]
        return
    trailing = trailing or kind is cst.TrailingWhitespace
    getter = _FIELDS_IN_ORDER.get(kind, _UNREAD)
    if getter is _UNREAD:
        getter = _fields_in_order(kind)
    if getter is None:
        for child in node.children:
            _comments(child, found, trailing)
        return
    for value in getter(node):
        value_kind = type(value)
        if value_kind is tuple or value_kind is list:
            for child in value:  # type: ignore[attr-defined]
                _comments(child, found, trailing)
        elif value_kind not in NOT_NODES:
            _comments(value, found, trailing)  # type: ignore[arg-type]


def children_in_order(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children`, read as `_comments` reads them (for the test that they agree)."""
    getter = _fields_in_order(type(node))
    if getter is None:
        return list(node.children)
    out: list[cst.CSTNode] = []
    for value in getter(node):
        if type(value) is tuple or type(value) is list:
            out.extend(value)  # type: ignore[arg-type]
        elif type(value) not in NOT_NODES:
            out.append(value)  # type: ignore[arg-type]
    return out


_UNREAD = object()
_LEAF = re.compile(r"\)\s*->[^:]*:\s*return self\s*$")
_VISITED_FIELD = re.compile(r"visit_\w+\(\s*self,\s*\"(\w+)\"")
# Per node type: a getter of its fields in the order libcst visits them, or None (use `children`).
_FIELDS_IN_ORDER: dict[type, Callable[[cst.CSTNode], tuple[object, ...]] | None] = {}


def _fields_in_order(kind: type) -> Callable[[cst.CSTNode], tuple[object, ...]] | None:
    getter: Callable[[cst.CSTNode], tuple[object, ...]] | None = None
    try:
        source = inspect.getsource(kind._visit_and_replace_children)  # type: ignore[attr-defined]
    except (OSError, TypeError):
        source = ""
    names = _VISITED_FIELD.findall(source)
    fields = {f.name for f in dataclasses.fields(kind)}
    if names and set(names) <= fields and len(set(names)) == len(names):
        getter = fields_getter(tuple(names))
    elif not names and _LEAF.search(source):
        getter = fields_getter(())  # a leaf: libcst visits nothing under it
    _FIELDS_IN_ORDER[kind] = getter
    return getter


def _blank(line: cst.EmptyLine) -> bool:
    return line.comment is None


def _split_leading(lines: Sequence[cst.EmptyLine]) -> tuple[list[cst.EmptyLine], list[cst.EmptyLine]]:
    n = 0
    while n < len(lines) and _blank(lines[n]):
        n += 1
    return list(lines[:n]), list(lines[n:])


def _split_trailing(lines: Sequence[cst.EmptyLine]) -> tuple[list[cst.EmptyLine], list[cst.EmptyLine]]:
    n = len(lines)
    while n > 0 and _blank(lines[n - 1]):
        n -= 1
    return list(lines[:n]), list(lines[n:])


def join(carried: Sequence[cst.EmptyLine], lines: Sequence[cst.EmptyLine], at_start: bool) -> list[cst.EmptyLine]:
    """`carried` (lines of removed statements) above `lines` (the leading lines of what follows
    them); `at_start`: nothing of the block comes before them."""
    if not carried:
        if at_start:
            return _split_leading(lines)[1]  # the removed first statement had no blank line above it
        return list(lines)
    head, carried_blank = _split_trailing(carried)
    lines_blank, rest = _split_leading(lines)
    if not head and at_start:
        return [*carried_blank, *rest]
    blank = carried_blank if len(carried_blank) >= len(lines_blank) else lines_blank
    return [*head, *blank, *rest]


def attach(stmt: cst.BaseStatement, carried: Sequence[cst.EmptyLine], at_start: bool) -> cst.BaseStatement:
    """`stmt` (kept after removed statements) with their lines above its own."""
    return stmt.with_changes(leading_lines=join(carried, stmt.leading_lines, at_start))


def footer(carried: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """Lines of removed statements at the end of a block: their comments, without blank lines after them."""
    return _split_trailing(carried)[0]


def inside(carried: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
    """Lines of removed statements above the `pass` that fills a block left empty."""
    return _split_leading(_split_trailing(carried)[0])[1]
