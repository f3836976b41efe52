"""The safety checks skip work that cannot change their verdict (each check's module docstring
says why). Here every shortcut is turned off and on again, and the verdicts (lines and messages)
must be the same: on every fixture's input with its golden output, and on outputs broken on
purpose so that the checks do find something (a string device rebound to `accelerator.device`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import libcst as cst
import pytest

from migrate.safety import CheckContext, device_type
from tests.migrate.test_safety_device import DEVICE, STRING, STRING_USES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PAIRS = sorted(FIXTURES.glob("*/*.out.py"))


class _StringsToDevices(cst.CSTTransformer):
    """Rebinds every name bound to a string (`_stringy`) to `accelerator.device`: what a wrong
    device rewrite would do; with `use`, the next line also uses the name as a string."""

    def __init__(self, use: bool) -> None:
        super().__init__()
        self.use = use

    def leave_SimpleStatementLine(  # type: ignore[override]
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        small = updated_node.body[0]
        if len(updated_node.body) != 1 or type(small) is not cst.Assign or not device_type._stringy(small.value):
            return updated_node
        line = updated_node.with_changes(body=[small.with_changes(value=cst.parse_expression("accelerator.device"))])
        target = small.targets[0].target
        if not self.use or type(target) is not cst.Name:
            return line
        return cst.FlattenSentinel([line, cst.parse_statement(f'on_gpu = "cuda" in {target.value}\n')])


def _cases() -> list[tuple[str, str, str]]:
    """(id, input, output): each fixture with its golden output, and with its strings made devices."""
    cases = []
    for out in PAIRS:
        name = f"{out.parent.name}/{out.name.removesuffix('.out.py')}"
        before = out.with_name(out.name.replace(".out.py", ".in.py")).read_text()
        cases.append((name, before, out.read_text()))
        try:
            module = cst.parse_module(before)
        except cst.ParserSyntaxError:
            continue
        for use in (False, True):
            broken = module.visit(_StringsToDevices(use)).code
            if broken != before:
                cases.append((f"{name} (strings made devices{', used as strings' if use else ''})", before, broken))
    for use, code in STRING_USES.items():
        cases.append((f"string use: {use}", STRING + code, DEVICE + code))
    return cases


CASES = _cases()


def _verdict(check, before: str, after: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    context = CheckContext("x.py", cst.parse_module(before), cst.parse_module(after), before, after, None)
    return [(v.line, v.message) for v in check(context)]


def test_the_broken_outputs_are_caught() -> None:
    found = [name for name, before, after in CASES if _verdict(device_type.check, before, after)]
    assert len(found) >= 5, found  # the comparisons below include real findings


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_device_type_without_the_binding_shortcut(case: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, before, after = case
    fast = _verdict(device_type.check, before, after)
    monkeypatch.setattr(device_type._Module, "binds_strings", lambda self: True)
    monkeypatch.setattr(device_type._Module, "binds_devices", lambda self: True)
    assert _verdict(device_type.check, before, after) == fast


# -- names-defined (AM104): the import patterns searched from their literal word ----------------

_IMPORT_TEXTS = [
    "from a import *\n", "from a import*\n", "ximport *\n", "x.import *\n", "_import *\n", "import *", "import\t*",
    "import os\n", "  import os.path, torch.distributed as dist  # c\n", "\timport a.b; import c.d\n",
    "# import x.y\n", "importx.y\n", "a = 1; import b.c\n", "s = 'import a.b'\nimport c.d\n", "import a.b\\\n  , c.d\n",
    "x = 1\n\n    import q.r\nimport", "import import a.b\n", "é import *\n", "éimport *\n",
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_import_patterns_from_their_word(case: tuple[str, str, str]) -> None:
    from migrate.safety.names_defined import _IMPORT_LINE, _STAR, _import_lines, _star_import

    for text in (*case[1:], *_IMPORT_TEXTS):
        assert _star_import(text) == (_STAR.search(text) is not None), text
        assert [m.span(1) for m in _import_lines(text)] == [m.span(1) for m in _IMPORT_LINE.finditer(text)], text


# -- accelerator-bound (AM101): one walk per node and target ------------------------------------


def _unbind_accelerator(text: str) -> str:
    """The output with every line that binds `accelerator` or `self.accelerator` dropped (a
    rewrite that forgot to create it): every read then fails."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.strip().startswith(("accelerator =", "self.accelerator =", "accelerator: ")))


def _binding_cases() -> list[tuple[str, str, str]]:
    cases = [c for c in CASES if "accelerator" in c[2]]
    for name, before, after in list(cases):
        broken = _unbind_accelerator(after)
        if broken != after:
            cases.append((f"{name} (accelerator not bound)", before, broken))
    return cases


BINDING_CASES = _binding_cases()
WALRUS = [
    "if (accelerator := make()):\n    pass\nprint(accelerator)\n",
    "f = lambda: (accelerator := 1)\nprint(accelerator)\n",
    "x: (accelerator := int) = 3\nprint(accelerator)\n",
    "ys = [accelerator := y for y in range(3)]\nprint(accelerator)\n",
    "while (accelerator := next(it, None)) is not None:\n    accelerator.print(1)\n",
    "def f(a=(accelerator := 1)):\n    pass\nprint(accelerator)\n",
    "with (accelerator := open(p)) as f:\n    pass\nprint(accelerator)\n",
    "total = sum(g(lambda: (accelerator := 2)) for g in gs if (accelerator := g))\n",
]


def test_the_unbound_outputs_are_caught() -> None:
    from migrate.safety import accelerator_bound

    found = [name for name, before, after in BINDING_CASES if _verdict(accelerator_bound.check, before, after)]
    assert len(found) >= 20, found


@pytest.mark.parametrize("case", BINDING_CASES, ids=[c[0] for c in BINDING_CASES])
def test_accelerator_bound_events_walked_once(case: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The events of a node are collected once and shared by every reader: the same verdict as
    collecting them afresh for each, and `walrus` is what `_walrus_binds` finds."""
    from migrate.safety import accelerator_bound as ab

    _, before, after = case
    fast = _verdict(ab.check, before, after)
    monkeypatch.setattr(ab._EventCache, "__call__", lambda self, node, target: ab._Events(target).collect(node))
    assert _verdict(ab.check, before, after) == fast


@pytest.mark.parametrize("text", [c[2] for c in BINDING_CASES[:40]] + WALRUS)
def test_events_find_the_walrus_that_walrus_binds_finds(text: str) -> None:
    from migrate.safety import accelerator_bound as ab
    from migrate.walk import children

    targets = [ab._Target(), ab._Target("self")]
    stack: list[cst.CSTNode] = [cst.parse_module(text)]
    found = 0
    while stack:
        node = stack.pop()
        stack.extend(children(node))
        for target in targets:
            walrus = ab._walrus_binds(node, target)
            assert ab._Events(target).collect(node).walrus == walrus, cst.Module([]).code_for_node(node)
            found += walrus
    assert found or text not in WALRUS


# -- output_tree: no node object in two places ---------------------------------------------------


def _each_node_once_by_children(root: cst.CSTNode) -> bool:
    from migrate.walk import children

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            return False
        seen.add(id(node))
        stack.extend(children(node))
    return True


def test_each_node_once_finds_a_node_in_two_places() -> None:
    from migrate.walk import each_node_once

    module = cst.parse_module("x = f(1, [2])\ny = 3\n")
    assert each_node_once(module)
    call = module.body[0].body[0].value  # type: ignore[attr-defined]
    one = call.args[0].value
    twice_leaf = module.with_deep_changes(call, args=[call.args[0], cst.Arg(cst.List([cst.Element(one)]))])
    twice_statement = module.with_changes(body=[*module.body, module.body[0]])
    for tree in (twice_leaf, twice_statement):
        assert not each_node_once(tree) and not _each_node_once_by_children(tree)


@pytest.mark.parametrize("case", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_each_node_once_as_by_children(case: tuple[str, str, str]) -> None:
    from migrate.walk import each_node_once

    for text in case[1:]:
        module = cst.parse_module(text)
        statements = list(module.body)
        for tree in (module, module.with_changes(body=[*statements, *statements[:1]])):
            assert each_node_once(tree) == _each_node_once_by_children(tree)


def _names_by_every_symbol(text: str) -> tuple[set[str], set[str], Counter[tuple[str, str]]]:
    """What `_Names` finds, looking up every symbol of every table (the reference)."""
    import symtable

    from migrate.safety.names_defined import _BUILTINS

    bound: set[str] = set()
    imported: set[str] = set()
    reads = []
    stack = [(symtable.symtable(text, "x.py", "exec"), "")]
    while stack:
        table, prefix = stack.pop()
        path = f"{prefix}/{table.get_name()}" if prefix else table.get_name()
        module = table.get_type() == "module"
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if module and (symbol.is_assigned() or symbol.is_imported()):
                bound.add(name)
            if module and symbol.is_imported():
                imported.add(name)
            if not module and symbol.is_declared_global() and (symbol.is_assigned() or symbol.is_imported()):
                bound.add(name)
            if symbol.is_referenced() and symbol.is_global() and name not in _BUILTINS:
                reads.append((path, name))
        stack.extend((child, path) for child in table.get_children())
    return bound, imported, Counter(key for key in reads if key[1] not in bound)


@pytest.mark.parametrize("case", CASES[::2], ids=[c[0] for c in CASES[::2]])
def test_names_read_from_a_functions_globals_only(case: tuple[str, str, str]) -> None:
    """A function's table is read through its globals: the same bindings and undefined reads as
    looking up every symbol of every table."""
    from migrate.safety.names_defined import _Names

    texts = [*case[1:], "def f():\n    global g\n    g = 1\n    return h + [x for x in k]\n\nclass A:\n    y = z\n"]
    for text in texts:
        names = _Names(text, "x.py")
        assert (names.bound, names.imported, names.undefined) == _names_by_every_symbol(text)
