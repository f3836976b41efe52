"""The analysis collects its facts in its own walk (`_Collector.collect`: one call per node, leaf
nodes skipped, libcst's no-op `visit_<Type>` methods never called). It must record exactly what
the generic `walk(module, collector)` records through `on_visit` / `on_leave`: checked field by
field on every fixture, inputs and outputs (nodes compared by identity)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import libcst as cst
import pytest

from migrate.analysis import _LEAVES, Facts, _Collector, _own, analyze
from migrate.walk import child_fields, walk

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FILES = sorted(p for p in FIXTURES.rglob("*.py") if "/out/" not in p.as_posix())


def _walked(module: cst.Module) -> Facts:
    """`analyze`, with the collector driven by the generic walk."""
    original = _Collector.collect

    def generic(self: _Collector, node: cst.CSTNode) -> None:
        walk(node, self)

    _Collector.collect = generic  # type: ignore[method-assign]
    try:
        return analyze(module)
    finally:
        _Collector.collect = original  # type: ignore[method-assign]


def _same(a: object, b: object, seen: set[tuple[int, int]], where: str) -> None:
    if isinstance(a, cst.CSTNode) or isinstance(b, cst.CSTNode):
        assert a is b, where
        return
    assert type(a) is type(b), where
    if (id(a), id(b)) in seen:
        return
    seen.add((id(a), id(b)))
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            _same(getattr(a, f.name), getattr(b, f.name), seen, f"{where}.{f.name}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where  # type: ignore[arg-type]
        for i, (x, y) in enumerate(zip(a, b)):  # type: ignore[call-overload]
            _same(x, y, seen, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), where  # type: ignore[call-overload]
        for key in a:
            _same(a[key], b[key], seen, f"{where}[{key!r}]")  # type: ignore[index]
    elif isinstance(a, (set, frozenset)):
        assert a == b, where
    elif type(a).__module__.startswith("migrate."):
        _same(vars(a), vars(b), seen, where)
    else:
        assert a == b, where


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_collect_records_what_the_generic_walk_records(path: Path) -> None:
    try:
        module = cst.parse_module(path.read_text())
    except cst.ParserSyntaxError:
        pytest.skip("not Python")
    _same(analyze(module), _walked(module), set(), "facts")


def test_skipped_leaves_hold_no_nodes_and_have_no_collector_method() -> None:
    for leaf in _LEAVES:
        assert _own(leaf, "visit_") is None and _own(leaf, "leave_") is None, leaf
        fields = {f.name: f.type for f in dataclasses.fields(leaf)}
        assert all(fields[name] in (str, "str") for name in child_fields(leaf)), leaf


def test_a_one_line_body_binds_on_its_def_line() -> None:
    """`def __init__(self): self.n = 0` has no statement of its own in its body: the binding
    belongs to the def line (it was an IndexError, an internal error on any file holding one)."""
    module = cst.parse_module(
        "class Meter:\n    def __init__(self): self.total = 0\n\ndef f(x): y = x\n"
    )
    facts = analyze(module)
    method_def = module.body[0].body.body[0]  # type: ignore[attr-defined]
    function_def = module.body[1]
    by_name = {scope.name: scope for scope in facts.scopes}
    [total] = by_name["__init__"].bindings["self.total"]
    assert total.where.stmt is method_def
    [y] = by_name["f"].bindings["y"]
    assert y.where.stmt is function_def
