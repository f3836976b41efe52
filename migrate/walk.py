"""Read-only traversal of a libcst tree: the same visitor protocol as `node.visit(visitor)`, without
its cost.

`CSTNode.visit` rebuilds every node it passes, even for a read-only `CSTVisitor` (each node's
children are re-assembled into a new dataclass instance, with validation). That made the analysis
pass cost more than parsing the file. `walk` reads a node's children straight from its fields,
calls `visitor.on_visit(node)` / `visitor.on_leave(node)` like libcst does (so `visit_<Type>` and
`leave_<Type>` methods work unchanged), and visits children in document order.

What it does not visit: whitespace, comments, parentheses, brackets, commas, colons and operator
tokens. No rule reads those through a visitor (a rule that needs a comparison's operator reads it
from the node). tests/migrate/test_walk.py checks, on every fixture, that `walk` reaches every other
node libcst's own traversal reaches, in the same order.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

# Fields that only hold formatting tokens.
_TRIVIA_FIELDS = frozenset({
    "asynchronous", "colon", "comma", "comment", "default_indent", "default_newline", "dot", "empty_lines",
    "encoding", "equal", "first_colon", "first_line", "footer", "has_trailing_newline", "header", "indent",
    "last_line", "lbrace", "lbracket", "leading_lines", "leading_whitespace", "lines_after_decorators", "lpar",
    "newline", "operator", "posonly_ind", "rbrace", "rbracket", "relative", "rpar", "second_colon", "semicolon",
    "separator", "star", "trailing_comma", "trailing_whitespace",
})

# Node types whose dataclass field order is not their order in the source text.
_DOCUMENT_ORDER: dict[str, tuple[str, ...]] = {
    "Arg": ("keyword", "value"),
    "FunctionDef": ("decorators", "name", "type_parameters", "params", "returns", "body"),
    "ClassDef": ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    "IfExp": ("body", "test", "orelse"),
    "ExceptHandler": ("type", "name", "body"),
    "ExceptStarHandler": ("type", "name", "body"),
    "Parameters": ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
    "MatchCase": ("pattern", "guard", "body"),
}

_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(node_type: type) -> tuple[str, ...]:
    names = [f.name for f in dataclasses.fields(node_type)
             if f.name not in _TRIVIA_FIELDS and not f.name.startswith("whitespace")]
    order = _DOCUMENT_ORDER.get(node_type.__name__)
    if order is not None:
        assert set(names) <= set(order), f"libcst added a field to {node_type.__name__}: {names}"
        names = [name for name in order if name in names]
    fields = _CHILD_FIELDS[node_type] = tuple(names)
    return fields


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The node's direct children that carry code (not formatting), in document order."""
    fields = _CHILD_FIELDS.get(type(node))
    if fields is None:
        fields = _child_fields(type(node))
    out: list[cst.CSTNode] = []
    for name in fields:
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            out.extend(value)
    return out


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """Visit `node` and its descendants: `on_visit` (children skipped when it returns False), then
    `on_leave`, exactly like `node.visit(visitor)` for a read-only visitor."""
    if visitor.on_visit(node):
        for child in children(node):
            walk(child, visitor)
    visitor.on_leave(node)


def with_ancestors(root: cst.CSTNode, targets: set[cst.CSTNode]) -> set[cst.CSTNode]:
    """`targets` (those inside `root`) and every node on the way from `root` down to one of them."""
    found: set[cst.CSTNode] = set()
    path: list[cst.CSTNode] = []

    def visit(node: cst.CSTNode) -> None:
        if node in targets:
            found.add(node)
            found.update(path)
        path.append(node)
        for child in children(node):
            visit(child)
        path.pop()

    visit(root)
    return found
