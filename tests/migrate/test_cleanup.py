"""`cleanup.remove_unused` rebuilds only the paths to what it removes, and its output is the one a
remover descending into every statement of the module gives, on every fixture."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate import cleanup
from migrate.engine import Options, migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted(FIXTURES.rglob("*.py"))


class _EveryNodeOutsideExpressions:
    """The remover's reach without pruning: every node that is not inside an expression."""

    def __contains__(self, node: cst.CSTNode) -> bool:
        return not isinstance(node, cst.BaseExpression)


def _outputs(monkeypatch: pytest.MonkeyPatch, pruned: bool) -> tuple[dict[Path, str | None], int]:
    removing = 0
    real_removals = cleanup.removals

    def counting(*args):  # type: ignore[no-untyped-def]
        nonlocal removing
        dead, unused = real_removals(*args)
        removing += bool(dead or unused)
        return dead, unused

    with monkeypatch.context() as patch:
        patch.setattr(cleanup, "removals", counting)
        if not pruned:
            patch.setattr(cleanup, "_paths_to_removals", lambda *args: _EveryNodeOutsideExpressions())
        outputs = {case: migrate_source(case.read_text(), str(case), Options()).new_text for case in CASES}
    return outputs, removing


def test_pruned_remover_matches_the_full_one_on_every_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    pruned, removing = _outputs(monkeypatch, pruned=True)
    full, _ = _outputs(monkeypatch, pruned=False)
    assert removing >= 20  # the comparison covers many removals, not a few
    assert [case for case in CASES if pruned[case] != full[case]] == []


def test_remover_leaves_statements_off_the_paths_as_they_are() -> None:
    module = cst.parse_module(
        "import os\nimport torch.distributed as dist\n\ndef f():\n    return os.getcwd()\n\nrank = 0\nx = 1\n"
    )
    rank_line = module.body[3]
    new = module.visit(cleanup._Remover({id(rank_line)}, set(), cleanup._paths_to_removals(module, {id(rank_line)}, False)))
    # the blank line that set the removed line apart now sets `x = 1` apart (migrate/carry.py)
    assert new.code == "import os\nimport torch.distributed as dist\n\ndef f():\n    return os.getcwd()\n\nx = 1\n"
    assert new.body[2] is module.body[2]  # not rebuilt
    assert new.body[3].deep_equals(module.body[4].with_changes(leading_lines=module.body[3].leading_lines))
