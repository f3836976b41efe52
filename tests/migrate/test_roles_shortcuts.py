"""The roles' shortcuts give what they stand for, on every fixture:

- `roles.model.transitive_callers` (each call site resolved once) finds what a fixed point over
  every unit finds, for the functions that train and for those that initialise the process group;
- `Roles.methods_of` (an index by parent) lists what a scan of the scopes lists;
- `Roles.can_reach` remembered per scope and accelerator scope: the same outputs and diagnostics
  as deciding it again on each call.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.analysis import Scope, analyze
from migrate.engine import Options, migrate_source
from migrate.prefilter import worth_parsing
from migrate.roles import find_roles
from migrate.roles.entry import training_functions
from migrate.roles.model import Roles, transitive_callers

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
        hidden = {id(scope) for scope, _ in roles.hidden_steps}  # a step run by an unread object
        seeds = {s for s in units if s.backwards or id(s) in hidden}
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


def test_remembered_reach_gives_the_outputs_of_deciding_it_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = sorted(FIXTURES.rglob("*.py"))

    def outputs() -> list[tuple[str | None, list[str]]]:
        results = [migrate_source(case.read_text(), str(case), Options()) for case in cases]
        return [(r.new_text, [f"{d.line} {d.code} {d.message}" for d in r.diagnostics]) for r in results]

    remembered = outputs()
    with monkeypatch.context() as patch:
        patch.setattr(Roles, "can_reach", lambda self, scope, _pending=frozenset(): (
            self.accelerator_scope is not None and self._reach(scope, self.accelerator_scope, _pending)))
        decided = outputs()
    assert [case for case, a, b in zip(cases, remembered, decided) if a != b] == []


def test_the_field_lists_of_the_shortcuts_name_every_field_they_stand_for() -> None:
    """AM001's id set of edited nodes must name exactly the plan fields `_edit_uses` reads, and the
    rewriter's statements-with-an-edit every field keyed by statements: a field added to one place
    and not the other would make a shortcut skip an edit."""
    import inspect
    import re

    from migrate.edits import STATEMENT_FIELDS
    from migrate.rules import create_accelerator

    read = set(re.findall(r"plan\.(\w+)", inspect.getsource(create_accelerator._edit_uses)))
    assert read == set(create_accelerator._USING_EDITS)
    assert set(STATEMENT_FIELDS) == {
        "replace_stmt", "insert_before", "insert_after", "drop_if_trivial", "remove_small", "replace_small",
        "rebound", "main_process_only", "main_process_first", "annotations", "unwrap_with", "launcher_rank_only",
    }
