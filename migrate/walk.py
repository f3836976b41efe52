"""Read-only traversal of a libcst tree: the same visitor protocol as `node.visit(visitor)`, without
its cost.

`CSTNode.visit` rebuilds every node it passes, even for a read-only `CSTVisitor` (each node's
children are re-assembled into a new dataclass instance, with validation). That made the analysis
pass cost more than parsing the file. `walk` reads a node's children straight from its fields,
calls `visitor.on_visit(node)` / `visitor.on_leave(node)` like libcst does (so `visit_<Type>` and
`leave_<Type>` methods work unchanged), and visits children in document order. A visitor that keeps
libcst's own `on_visit` / `on_leave` has its `visit_<Type>` / `leave_<Type>` methods called
directly, looked up once per visitor class and node type (libcst's own no-op defaults, which
every visitor class inherits for every node type, are not called at all). A visitor whose methods
are all for statement-level node types (`STATEMENT_LEVEL`: statements, blocks, clauses) is walked
without entering any other node: Python has no statement inside an expression, so its calls are
the same.

What it does not visit: whitespace, comments, parentheses, brackets, commas, colons and operator
tokens. No rule reads those through a visitor (a rule that needs a comparison's operator reads it
from the node). tests/migrate/test_walk.py checks, on every fixture, that `walk` reaches every other
node libcst's own traversal reaches, in the same order.

Node type tests in the hot walks (analysis, names, the safety checks) are written
`type(node) is cst.Name` rather than `isinstance(node, cst.Name)`: libcst's node classes derive from
ABC, so each isinstance runs ABCMeta's Python-level `__instancecheck__` (about a microsecond per
call with a tuple of classes, some 1.1 million calls per corpus run). The concrete node classes are
never subclassed, so the exact type test is the same test; abstract bases (`cst.BaseExpression`)
still need isinstance.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable, Sequence

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

# Per node type: a getter returning the values of its code-carrying fields, in document order.
_GETTERS: dict[type, Callable[[cst.CSTNode], tuple[object, ...]]] = {}
# Names and literals: their only child nodes are their parentheses (`lpar`, `rpar`: as many, as
# libcst checks), so one without any has none.
LEAVES = frozenset({cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString})
# Field values that are not nodes (isinstance against libcst's abstract CSTNode is slow).
NOT_NODES = frozenset({str, bool, int, type(None), cst.MaybeSentinel})


def child_fields(node_type: type) -> tuple[str, ...]:
    """The fields of a node type that can hold code (not formatting), in document order."""
    names = [f.name for f in dataclasses.fields(node_type)
             if f.name not in _TRIVIA_FIELDS and not f.name.startswith("whitespace")]
    order = _DOCUMENT_ORDER.get(node_type.__name__)
    if order is not None:
        assert set(names) <= set(order), f"libcst added a field to {node_type.__name__}: {names}"
        names = [name for name in order if name in names]
    return tuple(names)


def fields_getter(names: tuple[str, ...]) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    """A getter of the values of the fields `names`, as a tuple (one attrgetter call)."""
    if not names:
        return lambda node: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda node: (one(node),)
    return operator.attrgetter(*names)  # type: ignore[return-value]


def _getter(node_type: type) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    getter = _GETTERS[node_type] = fields_getter(child_fields(node_type))
    return getter


def child_getter(node_type: type) -> Callable[[cst.CSTNode], tuple[object, ...]]:
    """The getter of a node type's code-carrying field values, in document order (`children`
    without the flattening: a value may be a node, a sequence of nodes, or a str, bool or None)."""
    return _GETTERS.get(node_type) or _getter(node_type)


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The node's direct children that carry code (not formatting), in document order."""
    getter = _GETTERS.get(type(node)) or _getter(type(node))
    out: list[cst.CSTNode] = []
    for value in getter(node):
        kind = type(value)
        if kind is tuple or kind is list:
            out.extend(value)  # type: ignore[arg-type]
        elif kind not in NOT_NODES:
            out.append(value)  # type: ignore[arg-type]
    return out


class Visitor(cst.CSTVisitor):
    """A CSTVisitor whose `visit_<Type>` / `leave_<Type>` lookup is cached per node type (libcst
    formats and looks the name up again for every node). Works with `walk` and with `node.visit`."""

    _methods: dict[tuple[type, str], object]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._methods = {}

    def _method(self, prefix: str, node_type: type):  # type: ignore[no-untyped-def]
        key = (node_type, prefix)
        try:
            return self._methods[key]
        except KeyError:
            method = self._methods[key] = getattr(type(self), prefix + node_type.__name__, None)
            return method

    def on_visit(self, node: cst.CSTNode) -> bool:
        method = self._method("visit_", type(node))
        return method is None or method(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        method = self._method("leave_", type(original_node))
        if method is not None:
            method(self, original_node)


# Per visitor class whose `on_visit` / `on_leave` are libcst's (or `Visitor`'s) name lookup: per node
# type, its `visit_<Type>` and `leave_<Type>` functions and its child getter. Weak keys: rules define
# visitor classes inside functions, one per call.
_Dispatch = dict[type, tuple[Callable[..., object] | None, Callable[..., object] | None,
                             Callable[[cst.CSTNode], tuple[object, ...]]]]
_DISPATCH: weakref.WeakKeyDictionary[type, _Dispatch] = weakref.WeakKeyDictionary()
_NAME_LOOKUPS = frozenset({(cst.CSTVisitor.on_visit, cst.CSTVisitor.on_leave), (Visitor.on_visit, Visitor.on_leave)})


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """Visit `node` and its descendants: `on_visit` (children skipped when it returns False), then
    `on_leave`, exactly like `node.visit(visitor)` for a read-only visitor.

    A visitor that keeps libcst's own `on_visit` / `on_leave` (it only defines `visit_<Type>` /
    `leave_<Type>` methods) has those methods called directly, looked up once per node type: the
    per-node cost is then a table lookup and the calls the visitor asked for. A name or literal
    without parentheses (`LEAVES`: no child node) is not even entered when the visitor has no
    method for its type."""
    cls = type(visitor)
    if (cls.on_visit, cls.on_leave) in _NAME_LOOKUPS:
        dispatch = _DISPATCH.get(cls)
        if dispatch is None:
            dispatch = _DISPATCH[cls] = {}
            _STATEMENTS_ONLY[cls] = _methods_on_statements_only(cls)
            _UNVISITED_LEAVES[cls] = frozenset(
                kind for kind in LEAVES
                if own_method(cls, "visit_" + kind.__name__) is None and own_method(cls, "leave_" + kind.__name__) is None
            )
        if _STATEMENTS_ONLY[cls]:
            _walk_statements(node, visitor, dispatch)
        else:
            _walk_methods(node, visitor, dispatch, _UNVISITED_LEAVES[cls])
    else:
        _walk_hooks(node, visitor)


def _walk_hooks(node: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    if visitor.on_visit(node):
        for value in (_GETTERS.get(type(node)) or _getter(type(node)))(node):
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:  # type: ignore[attr-defined]
                    _walk_hooks(child, visitor)
            elif kind not in NOT_NODES:
                _walk_hooks(value, visitor)  # type: ignore[arg-type]
    visitor.on_leave(node)


# Per visitor class `walk` has seen: the leaf types (`LEAVES`) it has no method for. A leaf without
# parentheses has no child: `_walk_methods` then has nothing to call for it, and does not enter it.
_UNVISITED_LEAVES: weakref.WeakKeyDictionary[type, frozenset[type]] = weakref.WeakKeyDictionary()


def _walk_methods(node: cst.CSTNode, visitor: cst.CSTVisitor, dispatch: _Dispatch, skip: frozenset[type]) -> None:
    node_type = type(node)
    entry = dispatch.get(node_type)
    if entry is None:
        cls, name = type(visitor), node_type.__name__
        entry = dispatch[node_type] = (
            own_method(cls, "visit_" + name),
            own_method(cls, "leave_" + name),
            _GETTERS.get(node_type) or _getter(node_type),
        )
    visit, leave, getter = entry
    if visit is None or visit(visitor, node) is not False:
        for value in getter(node):
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:  # type: ignore[attr-defined]
                    if type(child) not in skip or child.lpar:
                        _walk_methods(child, visitor, dispatch, skip)
            elif kind not in NOT_NODES and (kind not in skip or value.lpar):  # type: ignore[attr-defined]
                _walk_methods(value, visitor, dispatch, skip)  # type: ignore[arg-type]
    if leave is not None:
        leave(visitor, node)


# Statement-level node types: statements, their blocks and clauses. Python has no statement inside
# an expression, so no other node (an expression, an argument, a parameter, a decorator, a
# pattern) holds one of these below it (tests/migrate/test_walk.py checks this on every fixture).
_STATEMENT_BASES = (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseSuite, cst.Module, cst.Else, cst.Finally,
                    cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)
STATEMENT_LEVEL = frozenset(  # read from the MROs: issubclass against libcst's ABCs costs 0.1 s here
    value for value in vars(cst).values()
    if isinstance(value, type) and cst.CSTNode in value.__mro__ and any(base in value.__mro__ for base in _STATEMENT_BASES)
)
_STATEMENT_NAMES = frozenset(kind.__name__ for kind in STATEMENT_LEVEL)
# Per visitor class `walk` has seen: whether all its `visit_<Type>` / `leave_<Type>` methods are for
# statement-level types (`_walk_statements` then skips every expression: about half the nodes of a
# module, and most of what the rules' statement searches used to walk).
_STATEMENTS_ONLY: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _methods_on_statements_only(cls: type) -> bool:
    libcst_classes = cst.CSTVisitor.__mro__
    for klass in cls.__mro__:
        if klass in libcst_classes or klass is Visitor:
            continue
        for name in vars(klass):
            prefix, _, node_type = name.partition("_")
            if prefix in ("visit", "leave") and node_type not in _STATEMENT_NAMES:
                return False
    return True


def _walk_statements(node: cst.CSTNode, visitor: cst.CSTVisitor, dispatch: _Dispatch) -> None:
    """`_walk_methods` for a visitor whose methods are all for statement-level node types: the
    same calls in the same order, without entering nodes that cannot hold a statement."""
    node_type = type(node)
    entry = dispatch.get(node_type)
    if entry is None:
        cls, name = type(visitor), node_type.__name__
        entry = dispatch[node_type] = (
            own_method(cls, "visit_" + name),
            own_method(cls, "leave_" + name),
            _GETTERS.get(node_type) or _getter(node_type),
        )
    visit, leave, getter = entry
    if visit is None or visit(visitor, node) is not False:
        statement_level = STATEMENT_LEVEL
        for value in getter(node):
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:  # type: ignore[attr-defined]
                    if type(child) in statement_level:
                        _walk_statements(child, visitor, dispatch)
            elif kind in statement_level:
                _walk_statements(value, visitor, dispatch)  # type: ignore[arg-type]
    if leave is not None:
        leave(visitor, node)


def own_method(cls: type, name: str) -> Callable[..., object] | None:
    """The visitor's `visit_<Type>` / `leave_<Type>`; None where it keeps libcst's default, a no-op
    that returns None (so the children are visited, as without a method)."""
    method = getattr(cls, name, None)
    return None if method is getattr(cst.CSTVisitor, name, None) else method


def with_ancestors(root: cst.CSTNode, targets: set[cst.CSTNode]) -> set[cst.CSTNode]:
    """`targets` (those inside `root`) and every node on the way from `root` down to one of them.
    `root` holds each node once (a parsed tree, or an output `each_node_once` passed): the walk
    stops at the last target."""
    found: set[cst.CSTNode] = set()
    path: list[cst.CSTNode] = []
    ids = {id(node) for node in targets}  # (a node's own __hash__ is Python code)
    left = len(ids)
    leaves = LEAVES

    def visit(node: cst.CSTNode) -> None:
        nonlocal left
        if id(node) in ids:
            found.add(node)
            found.update(path)
            left -= 1
            if not left:
                raise AllFound
        path.append(node)
        for value in (_GETTERS.get(type(node)) or _getter(type(node)))(node):
            kind = type(value)
            if kind is tuple or kind is list:
                for child in value:  # type: ignore[attr-defined]
                    if type(child) in leaves and not child.lpar and id(child) not in ids:
                        continue  # a name or literal without parentheses: nothing below it
                    visit(child)
            elif kind not in NOT_NODES:
                if kind in leaves and not value.lpar and id(value) not in ids:  # type: ignore[attr-defined]
                    continue
                visit(value)  # type: ignore[arg-type]
        path.pop()

    if left:
        try:
            visit(root)
        except AllFound:
            pass
    return found


def contains(root: cst.CSTNode, node: cst.CSTNode) -> bool:
    """`node` (by identity) is `root` or lies inside it."""
    return node is root or bool(with_ancestors(root, {node}))


class AllFound(Exception):
    """Every node a walk looks for is found: the rest of the tree is not needed."""


def statement_blocks(stmt: cst.BaseStatement) -> list[Sequence[cst.BaseStatement]]:
    """The statement blocks of a compound statement (not of a def or class: they run later)."""
    if isinstance(stmt, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)):
        return []
    out: list[Sequence[cst.BaseStatement]] = []
    for part in (getattr(stmt, "body", None), getattr(stmt, "orelse", None), getattr(stmt, "finalbody", None)):
        if isinstance(part, cst.If):
            out.extend(statement_blocks(part))
        elif isinstance(part, (cst.Else, cst.Finally)):
            part = part.body
        if isinstance(part, cst.IndentedBlock):
            out.append(part.body)
    for handler in getattr(stmt, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            out.append(handler.body.body)
    for case in getattr(stmt, "cases", ()):
        if isinstance(case.body, cst.IndentedBlock):
            out.append(case.body.body)
    return out


def each_node_once(root: cst.CSTNode) -> bool:
    """True when no node object sits in two places of the tree under `root` (what a parse
    gives); False at the first one met again. One pass with the child getters inlined: it runs
    on every checked output."""
    seen: set[int] = set()
    add = seen.add
    stack: list[object] = [root]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        node = pop()
        key = id(node)
        if key in seen:
            return False
        add(key)
        kind = type(node)
        for value in (_GETTERS.get(kind) or _getter(kind))(node):  # type: ignore[arg-type]
            value_kind = type(value)
            if value_kind is tuple or value_kind is list:
                extend(value)  # type: ignore[arg-type]
            elif value_kind not in NOT_NODES:
                push(value)
    return True
