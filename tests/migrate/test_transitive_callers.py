"""`roles.model.transitive_callers` (each call site resolved once) finds what a fixed point over
every unit finds, for the functions that train and for those that initialise the process group,
on every fixture; and `Roles.methods_of` (an index by parent) lists what a scan of the scopes lists."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.analysis import Scope, analyze
from migrate.prefilter import worth_parsing
from migrate.roles import find_roles
from migrate.roles.entry import training_functions
from migrate.roles.model import transitive_callers

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = [p for p in sorted(FIXTURES.rglob("*.in.py")) if worth_parsing(p.read_text())]


def _fixed_point(units: list[Scope], seeds: set[Scope], runs) -> set[Scope]:  # type: ignore[no-untyped-def]
    found = set(seeds)
    changed = True
    while changed:
        changed = False
        for unit in units:
            if unit not in found and any(runs(site.callee, unit) in found for site in unit.calls):
                found.add(unit)
                changed = True
    return found


def test_transitive_callers_equal_the_fixed_point_on_every_fixture() -> None:
    deep = 0
    for case in CASES:
        text = case.read_text()
        roles = find_roles(analyze(cst.parse_module(text), text))
        units = [s for s in roles.facts.scopes if s.is_function]
        seeds = {s for s in units if s.backwards}
        expected = _fixed_point(units, seeds, roles.runs)
        assert training_functions(roles) == expected, case
        functions = roles.facts.plain_functions()
        inits = {fn for fn in functions if any(c.qualified.endswith("init_process_group") for c in fn.library_calls)}
        assert transitive_callers(functions, inits, roles.facts.resolve) == _fixed_point(functions, inits, roles.facts.resolve)
        deep += len(expected) > len(seeds)
    assert deep >= 20  # many fixtures train through helpers, not only where backward is called


def test_transitive_callers_follows_chains_not_callees() -> None:
    text = "def a():\n    b()\ndef b():\n    c()\ndef c():\n    loss.backward()\ndef d():\n    pass\nc()\n"
    roles = find_roles(analyze(cst.parse_module(text), text))
    assert {s.name for s in training_functions(roles)} == {"a", "b", "c"}


def test_methods_of_equals_a_scan_of_the_scopes_on_every_fixture() -> None:
    methods = 0
    for case in CASES:
        text = case.read_text()
        roles = find_roles(analyze(cst.parse_module(text), text))
        for scope in roles.facts.scopes:
            expected = None
            if scope.is_method and scope.parent is not None:
                expected = [s for s in roles.facts.scopes if s.parent is scope.parent and s.is_function]
                methods += 1
            assert roles.methods_of(scope) == expected
    assert methods >= 50
