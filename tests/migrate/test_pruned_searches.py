"""The rewriter's pruned transforms give the output of transforms that rebuild every node, on
every fixture: `_ToSelfAccelerator` (`accelerator` -> `self.accelerator` in a method) descends only
towards the `accelerator` names of the method body."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate import rewriter
from migrate.engine import Options, migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted(FIXTURES.rglob("*.py"))


class _Everything:
    def __contains__(self, node: cst.CSTNode) -> bool:
        return True


def _outputs(monkeypatch: pytest.MonkeyPatch, pruned: bool) -> tuple[dict[Path, str | None], int]:
    methods = 0
    real_paths = rewriter._paths_to_accelerator

    def counting(root: cst.CSTNode) -> object:
        nonlocal methods
        methods += 1
        return real_paths(root) if pruned else _Everything()

    with monkeypatch.context() as patch:
        patch.setattr(rewriter, "_paths_to_accelerator", counting)
        outputs = {case: migrate_source(case.read_text(), str(case), Options()).new_text for case in CASES}
    return outputs, methods


def test_pruned_self_accelerator_matches_the_full_transform_on_every_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    pruned, methods = _outputs(monkeypatch, pruned=True)
    full, _ = _outputs(monkeypatch, pruned=False)
    assert methods >= 20  # the comparison covers many methods, not a few
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
