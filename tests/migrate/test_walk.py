"""The engine's fast tree helpers agree with libcst's own machinery on every fixture.

- `walk` reaches every node libcst's `visit` reaches except formatting tokens, in the same order;
- `start_lines` gives each node the start line libcst's PositionProvider gives it;
- `with_ancestors` returns the targets and exactly their ancestors (libcst's ParentNodeProvider).
"""

from __future__ import annotations

import random
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from migrate.cleanup import name_uses
from migrate.positions import start_lines
from migrate import walk as walk_module
from migrate.walk import STATEMENT_LEVEL, Visitor, walk, with_ancestors

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Every syntax form whose field order differs from its source order, and the rarer statements.
SYNTAX = '''\
@decorator(arg)
@other
async def f(a, /, b: int = 1, *args, c, d=2, **kwargs) -> "T":
    """doc"""
    async with lock() as held, other():
        await g(x if cond else y, *rest, key=value, **extra)
    async for item in stream():
        yield item
    return [v async for v in w if v]


@register
class C(Base, metaclass=Meta):
    attr: int = 3
    def method(self, x=lambda q, *, r=1: q + r):
        global G
        del self.x[1:2:3], y
        try:
            raise E("m") from cause
        except (A, B) as error:
            assert error, "msg"
        else:
            x @= y
        finally:
            nonlocal_ = {k: v for k, v in d.items() if k not in s}
        try:
            pass
        except* C as group:
            pass
        while not done or (a := b) is None:
            break
        match point:
            case Point(x=0, y=yy) if yy > 0:
                print(f"{yy!r:>{width}} at {x}")
            case [1, *others] | {"k": _, **more}:
                continue
            case _:
                ...
from . import sibling
from ..pkg.mod import (a as b, c)
import os.path as osp, sys
x = y = -z ** 2 if not flag else ~w
print(a < b <= c != d, a in b, a not in b, a is not b, (yield_ := 1), {1, 2}, (1,), [*xs])
'''


def _sources() -> list[tuple[str, str]]:
    files = sorted(FIXTURES.rglob("*.py"))
    return [("syntax", SYNTAX)] + [(str(p.relative_to(FIXTURES)), p.read_text()) for p in files]


SOURCES = _sources()
FORMATTING = (
    cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment,
    cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
    cst.RightCurlyBrace, cst.Comma, cst.Semicolon, cst.Colon, cst.Dot, cst.AssignEqual, cst.BaseBinaryOp,
    cst.BaseBooleanOp, cst.BaseCompOp, cst.BaseUnaryOp, cst.BaseAugOp, cst.Asynchronous, cst.ParamSlash,
    cst.ImportStar, cst.ParamStar,
)


class _Recorder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.seen: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.seen.append(node)
        return super().on_visit(node)


@pytest.mark.parametrize(("name", "text"), SOURCES, ids=[name for name, _ in SOURCES])
def test_walk_visits_what_libcst_visits_in_the_same_order(name: str, text: str) -> None:
    module = cst.parse_module(text)
    theirs, ours = _Recorder(), _Recorder()
    module.visit(theirs)
    walk(module, ours)
    expected = [node for node in theirs.seen if not isinstance(node, FORMATTING)]
    got = [node for node in ours.seen if not isinstance(node, FORMATTING)]
    assert [type(n).__name__ for n in got] == [type(n).__name__ for n in expected]
    assert all(a is b for a, b in zip(got, expected))


def _method_recorder() -> type[cst.CSTVisitor]:
    """A visitor with only `visit_<Type>` / `leave_<Type>` methods, one pair per node class (so
    `walk` calls them directly instead of going through `on_visit`); `visit_Lambda` skips the
    lambda's children."""

    def visit(self, node):  # type: ignore[no-untyped-def]
        self.seen.append(("visit", node))

    def leave(self, node):  # type: ignore[no-untyped-def]
        self.seen.append(("leave", node))

    methods: dict[str, object] = {"__init__": lambda self: setattr(self, "seen", [])}
    for name in dir(cst):
        node_class = getattr(cst, name)
        if isinstance(node_class, type) and issubclass(node_class, cst.CSTNode):
            methods["visit_" + name], methods["leave_" + name] = visit, leave
    methods["visit_Lambda"] = lambda self, node: visit(self, node) or False
    return type("MethodRecorder", (cst.CSTVisitor,), methods)


@pytest.mark.parametrize(("name", "text"), SOURCES, ids=[name for name, _ in SOURCES])
def test_walk_calls_visit_and_leave_methods_as_libcst_does(name: str, text: str) -> None:
    module = cst.parse_module(text)
    recorder_class = _method_recorder()
    theirs, ours = recorder_class(), recorder_class()
    module.visit(theirs)
    walk(module, ours)
    expected = [(event, node) for event, node in theirs.seen if not isinstance(node, FORMATTING)]
    got = [(event, node) for event, node in ours.seen if not isinstance(node, FORMATTING)]
    assert [(event, type(n).__name__) for event, n in got] == [(event, type(n).__name__) for event, n in expected]
    assert all(a is b for (_, a), (_, b) in zip(got, expected))


def test_walk_honours_on_visit_returning_false() -> None:
    class Outer(_Recorder):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    recorder = Outer()
    walk(cst.parse_module("def f():\n    inner = 1\nouter = 2\n"), recorder)
    names = [n.value for n in recorder.seen if isinstance(n, cst.Name)]
    assert names == ["outer"]


@pytest.mark.parametrize(("name", "text"), SOURCES, ids=[name for name, _ in SOURCES])
def test_no_statement_below_a_node_that_is_not_one(name: str, text: str) -> None:
    """What lets `walk` skip every other node for a visitor of statement-level types only."""
    module = cst.parse_module(text)
    recorder_class = _method_recorder()
    recorder = recorder_class()
    walk(module, recorder)
    depth_outside = 0  # how many enclosing nodes are not statement-level
    for event, node in recorder.seen:
        inside = type(node) in STATEMENT_LEVEL
        if event == "visit":
            assert not (inside and depth_outside), f"{type(node).__name__} below an expression"
            depth_outside += not inside
        else:
            depth_outside -= not inside
    assert depth_outside == 0


def _statement_recorder(skip_functions: bool) -> type[cst.CSTVisitor]:
    """A visitor with methods for every statement-level type only."""

    def visit(self, node):  # type: ignore[no-untyped-def]
        self.seen.append(("visit", node))
        return not (skip_functions and type(node) is cst.FunctionDef)

    def leave(self, node):  # type: ignore[no-untyped-def]
        self.seen.append(("leave", node))

    methods: dict[str, object] = {"__init__": lambda self: setattr(self, "seen", [])}
    for node_class in STATEMENT_LEVEL:
        methods["visit_" + node_class.__name__], methods["leave_" + node_class.__name__] = visit, leave
    return type("StatementRecorder", (Visitor,), methods)


@pytest.mark.parametrize(("name", "text"), SOURCES, ids=[name for name, _ in SOURCES])
def test_walk_of_statement_methods_calls_them_as_libcst_does(name: str, text: str) -> None:
    module = cst.parse_module(text)
    for skip in (False, True):
        recorder_class = _statement_recorder(skip)
        theirs, ours = recorder_class(), recorder_class()
        assert walk_module._STATEMENTS_ONLY.get(recorder_class) is None
        module.visit(theirs)
        walk(module, ours)
        assert walk_module._STATEMENTS_ONLY[recorder_class]  # the pruned walk
        assert len(ours.seen) == len(theirs.seen) > 0
        assert all(a == b and x is y for (a, x), (b, y) in zip(ours.seen, theirs.seen))


@pytest.mark.parametrize(("name", "text"), SOURCES, ids=[name for name, _ in SOURCES])
def test_start_lines_match_position_provider(name: str, text: str) -> None:
    module = cst.parse_module(text)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = start_lines(module)
    assert set(lines) >= set(positions)
    mismatched = [(type(n).__name__, lines[n], p.start.line) for n, p in positions.items() if lines[n] != p.start.line]
    assert mismatched == []


def test_start_lines_count_windows_and_old_mac_newlines() -> None:
    module = cst.parse_module("a = 1\r\nb = 2\r\nc = '''x\r\ny'''\r\nd = 4\r\n")
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = start_lines(module)
    assert [lines[s] for s in module.body] == [positions[s].start.line for s in module.body] == [1, 2, 3, 5]


@pytest.mark.parametrize(("name", "text"), SOURCES[:40], ids=[name for name, _ in SOURCES[:40]])
def test_with_ancestors_is_targets_and_their_parents(name: str, text: str) -> None:
    module = cst.parse_module(text)
    parents = MetadataWrapper(module, unsafe_skip_copy=True).resolve(ParentNodeProvider)
    recorder = _Recorder()
    walk(module, recorder)
    targets = set(random.Random(name).sample(recorder.seen, min(5, len(recorder.seen))))
    expected: set[cst.CSTNode] = set()
    for node in targets:
        while True:
            expected.add(node)
            if node not in parents:
                break
            node = parents[node]
    assert with_ancestors(module, targets) == expected


def test_name_uses_counts_code_names_not_attributes_strings_or_comments() -> None:
    module = cst.parse_module(
        "import torch.distributed as dist\n"
        "rank = dist.get_rank()  # rank in a comment\n"
        "print(f'{rank}', 'rank', obj.rank, f(rank=1))\n"
    )
    uses = name_uses(module)
    # binding + the f-string field + the keyword argument; not `obj.rank`, the string or the comment
    assert uses["rank"] == 3
    assert uses["dist"] == 2 and uses["torch"] == 1 and uses["get_rank"] == 0 and uses["distributed"] == 0
