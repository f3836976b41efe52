"""Searches and transforms that descend only towards what they look for give, on every fixture,
the output of the same search or transform descending everywhere:

- the rewriter's `_ToSelfAccelerator` (`accelerator` -> `self.accelerator` in a method) descends
  only towards the `accelerator` names of the method body;
- AM002's search for reads of a moved model (`remove_device_moves._ReadsAfterMove`) enters,
  before the move, only the nodes on the way to the move and to the prepare call;
- the rewriter's block rebuild keeps a statement without an edit of its own as it is.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate import rewriter
from migrate.rules import remove_device_moves
from migrate.engine import Options, migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted(FIXTURES.rglob("*.py"))


class _Everything:
    def __contains__(self, node: cst.CSTNode) -> bool:
        return True


def _outputs(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str, pruned: bool
) -> tuple[dict[Path, tuple[str | None, list[str]]], int]:
    """Every fixture's output and diagnostics, with `module.name` (the pruning) real or reaching everything."""
    searches = 0
    real_paths = getattr(module, name)

    def counting(*args: object) -> object:
        nonlocal searches
        searches += 1
        return real_paths(*args) if pruned else _Everything()

    outputs = {}
    with monkeypatch.context() as patch:
        patch.setattr(module, name, counting)
        for case in CASES:
            result = migrate_source(case.read_text(), str(case), Options())
            outputs[case] = (result.new_text, [f"{d.line} {d.code} {d.message}" for d in result.diagnostics])
    return outputs, searches


@pytest.mark.parametrize(("module", "name", "least"), [
    (rewriter, "_paths_to_accelerator", 20),  # methods given `self.accelerator`
    (remove_device_moves, "_paths_to", 20),  # model moves searched for reads before prepare
])
def test_pruned_search_matches_the_full_one_on_every_fixture(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str, least: int
) -> None:
    pruned, searches = _outputs(monkeypatch, module, name, pruned=True)
    full, _ = _outputs(monkeypatch, module, name, pruned=False)
    assert searches >= least  # the comparison covers many searches, not a few
    assert [case for case in CASES if pruned[case] != full[case]] == []


def test_self_accelerator_keeps_keywords_attributes_and_parameters_and_untouched_statements() -> None:
    body = cst.parse_statement(
        "def step(self, accelerator=None):\n"
        "    x = 1\n"
        "    accelerator.backward(loss, accelerator=obj.accelerator)\n"
    ).body
    new = body.visit(rewriter._ToSelfAccelerator("self", body))
    assert cst.Module([]).code_for_node(new) == (
        "\n    x = 1\n    self.accelerator.backward(loss, accelerator=obj.accelerator)\n"
    )
    assert new.body[0] is body.body[0]  # not rebuilt


def test_rewriter_keeps_unedited_statements_as_the_full_rebuild_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Rewriter._rebuild` keeps a statement without an edit of its own without consulting every
    field of the plan: the outputs are those of consulting them for every statement."""
    fast = {case: migrate_source(case.read_text(), str(case), Options()).new_text for case in CASES}
    real_init = rewriter.Rewriter.__init__

    def every_statement_looked_up(self: rewriter.Rewriter, *args: object) -> None:
        real_init(self, *args)  # type: ignore[arg-type]
        self.statement_edits = _Everything()  # type: ignore[assignment]

    with monkeypatch.context() as patch:
        patch.setattr(rewriter.Rewriter, "__init__", every_statement_looked_up)
        slow = {case: migrate_source(case.read_text(), str(case), Options()).new_text for case in CASES}
    assert sum(text is not None for text in fast.values()) >= 100
    assert [case for case in CASES if fast[case] != slow[case]] == []
