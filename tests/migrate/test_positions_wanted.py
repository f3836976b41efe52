"""`start_lines(module, wanted)` places the wanted nodes by the statements around them, yet gives
each the line the whole-file pass (PositionProvider's line, tests/migrate/test_walk.py) gives it."""

from __future__ import annotations

import random
import re
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from migrate.positions import _line_count, start_lines
from migrate.walk import children

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SOURCES = sorted(FIXTURES.rglob("*.py"))
NEWLINES = re.compile(r"\r\n?|\n")

# The layouts where a statement's lines are easy to get wrong.
EDGES = {
    "decorators": (
        "# lead\n\n@first(\n    arg,\n)\n# between\n\n@second\n\ndef f(a,\n      b):\n    return a\n"
        "@d\nclass C:\n    @property\n    # note\n    async def m(self): ...\n"
    ),
    "strings": 'a = """one\ntwo\n"""\nb = f"""x{\n  y\n}z"""\nc = (\n    "p"\n    "q"\n)\nd = 1\n',
    "continuations": "x = 1 + \\\n    2\nif a and \\\n        b:\n    y = \\\n        3\nz = 4\n",
    "semicolons": "a = 1; b = 2\nif x: c = 3; d = 4\nelse: e = 5\nwhile y: f(); g()\nh = 6\n",
    "elif": (
        "if a:\n    x = 1\n# c\nelif b:\n\n    x = 2\nelif (c or\n      d):\n    x = 3\nelse:\n    x = 4\n"
        "after = 5\n"
    ),
    "try": (
        "try:\n    a()\nexcept (E,\n        F) as e:\n    b()\nelse:\n    c()\nfinally:\n    d()\n"
        "try:\n    a()\nexcept* G:\n    b()\nexcept* H as h:\n    c()\n"
    ),
    "loops": "for i in range(\n        3):\n    a(i)\nelse:\n    b()\nwith p() as q, \\\n     r():\n    s()\n",
    "match": (
        "match cmd:\n    # lead\n    case [x,\n          y] if x:\n        a()\n    case {'k': v}:\n        b()\n"
        "    case _: c()\n# footer\nz = 1\n"
    ),
    "comments": (
        "# top\n\n\ndef f():\n    x = 1\n    # trailing comment owned by the block\n\n# next\ny = (  # c\n    2\n)\n"
        "class K:\n    pass\n\n    # indented footer\n\n\nw = 3\n"
    ),
    "crlf": "a = 1\r\nif a:\r\n    b = '''x\r\ny'''\r\n    c = 2\r\nd = 4\r\n",
    "old_mac": "a = 1\rif a:\r    b = 2\rc = 3\r",
    "no_trailing_newline": "def f():\n    return 1\nx = f()",
    "nested": (
        "class A:\n    def f(self):\n        if x:\n            for y in z:\n                while w:\n"
        "                    with v:\n                        t = (\n                            1)\n"
        "                        u = 2\n    g = 3\n"
    ),
}


def _code_nodes(module: cst.Module) -> list[cst.CSTNode]:
    out, stack = [], [module]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(children(node)))
    return out


def _statements(nodes: list[cst.CSTNode]) -> list[cst.CSTNode]:
    kinds = (cst.BaseStatement, cst.BaseSmallStatement, cst.BaseSuite, cst.Else, cst.Finally,
             cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase, cst.Decorator)
    return [n for n in nodes if isinstance(n, kinds)]


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_wanted_nodes_get_the_full_pass_line(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    full = start_lines(module)
    nodes = list(full)  # every node, in the order the pass finishes them (formatting too)
    rng = random.Random(path.name)
    for size in (1, 3, 12):
        wanted = rng.sample(nodes, min(size, len(nodes)))
        partial = start_lines(module, wanted)
        assert {n: partial.get(n) for n in wanted} == {n: full[n] for n in wanted}


def _assert_placed_like_the_full_pass(module: cst.Module, full: dict[cst.CSTNode, int], name: str) -> None:
    code = _code_nodes(module)
    rng = random.Random(name)
    sets = [code, _statements(code)] + [rng.sample(code, min(k, len(code))) for k in (1, 2, 5, 20)]
    sets += [[node] for node in _statements(code)[:60]]
    for wanted in sets:
        placed = start_lines(module, wanted)
        mismatched = [(type(n).__name__, placed.get(n), full[n]) for n in wanted if placed.get(n) != full[n]]
        assert mismatched == []


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_statements_and_code_nodes_are_placed_like_the_full_pass(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    _assert_placed_like_the_full_pass(module, start_lines(module), path.name)


@pytest.mark.parametrize("name", sorted(EDGES))
def test_layouts_are_placed_like_position_provider(name: str) -> None:
    module = cst.parse_module(EDGES[name])
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    _assert_placed_like_the_full_pass(module, {n: p.start.line for n, p in positions.items()}, name)


@pytest.mark.parametrize("name", sorted(EDGES))
def test_line_count_is_the_newlines_of_the_code(name: str) -> None:
    module = cst.parse_module(EDGES[name])
    for node in _code_nodes(module)[1:]:  # not the module (it drops a missing final newline)
        try:
            code = module.code_for_node(node)
        except cst.CSTCodegenError:  # a node whose code depends on its parent (an annotation)
            continue
        assert _line_count(node) == len(NEWLINES.findall(code)), type(node).__name__


@pytest.mark.parametrize("path", SOURCES[::7], ids=[str(p.relative_to(FIXTURES)) for p in SOURCES[::7]])
def test_line_count_on_fixture_statements(path: Path) -> None:
    module = cst.parse_module(path.read_text())
    for node in _statements(_code_nodes(module)):
        assert _line_count(node) == len(NEWLINES.findall(module.code_for_node(node))), type(node).__name__


def test_a_formatting_node_falls_back_to_the_whole_pass() -> None:
    module = cst.parse_module("a = 1\n# note\nb = 2  # tail\n")
    comment = module.body[1].leading_lines[0].comment
    assert comment is not None
    assert start_lines(module, [comment])[comment] == 2


def test_the_pass_stops_after_the_last_wanted_node() -> None:
    module = cst.parse_module("a = 1\nif a:\n    b = 2\nc = 3\nd = 4\n")
    first = module.body[0]
    partial = start_lines(module, [first])
    assert partial[first] == 1 and module.body[-1] not in partial
    assert start_lines(module, [module.body[-1]])[module.body[-1]] == 5


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(FIXTURES)) for p in SOURCES])
def test_counts_of_the_placing_walk_are_the_statement_line_counts(path: Path) -> None:
    """`start_lines(..., counts)` records the newlines of each top-level item and each statement
    of an indented block it went past (`engine.run_rules` hands them to `statement_texts` and
    `inner_statement_texts`): each is `_line_count`'s, and the statement texts cut with them are
    the texts cut without."""
    from migrate.positions import statement_texts

    text = path.read_text()
    module = cst.parse_module(text)
    code = _code_nodes(module)
    rng = random.Random(path.name)
    alone = statement_texts(module, text)
    for wanted in [code, _statements(code)[:1], *(rng.sample(code, min(k, len(code))) for k in (1, 2, 5))]:
        counts: dict[int, int] = {}
        start_lines(module, wanted, counts)
        items = {id(item): item for item in (*module.header, *module.body, *module.footer)}
        items.update((id(stmt), stmt) for node in code if type(node) is cst.IndentedBlock for stmt in node.body)
        assert set(counts) <= set(items)
        assert all(count == _line_count(items[key]) for key, count in counts.items())
        assert statement_texts(module, text, counts) == alone


def test_a_wanted_simple_statement_is_placed_without_generating_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A simple statement line holding wanted nodes is placed by its counts when its code after its
    leading lines is one line, or when it is itself the only node wanted in it; a wanted node
    inside a statement spanning lines is generated. Each gets the whole-file pass's line."""
    from migrate import positions

    text = "# a\n\nx = f(a, b)  # c\nif x:\n\n    # d\n    y = g(\n        x)\n    z = h(x); w = 1\n"
    module = cst.parse_module(text)
    x = module.body[0]
    call = x.body[0].value
    block = module.body[1].body
    y, z = block.body
    inner = y.body[0].value.args[0].value
    full = start_lines(module)
    generated: list[cst.CSTNode] = []
    generate = positions._Placer.generate
    monkeypatch.setattr(positions._Placer, "generate",
                        lambda self, node, line, stop_at=None: generated.append(node) or generate(self, node, line, stop_at))
    for wanted, generates in (([x, call], False), ([z, z.body[1]], False), ([y], False), ([inner], True)):
        generated.clear()
        placed = start_lines(module, wanted)
        assert {n: placed[n] for n in wanted} == {n: full[n] for n in wanted}
        assert generated == ([y] if generates else [])
    assert (full[x], full[call], full[y], full[inner], full[z]) == (3, 3, 7, 8, 9)
