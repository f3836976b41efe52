"""The safety checks read the rules' rewritten tree instead of parsing the output again
(`migrate.safety.fallback.output_tree`). That is sound only while the tree is what a parse of its
code gives, and no node object sits in two places (analyses keyed by node would merge them). Both
are checked here on the output of every fixture; the property tests check the first on generated
programs (`benchmarks/fuzz_programs.py`, property 7)."""

from __future__ import annotations

import sys
from pathlib import Path

import libcst as cst
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the benchmarks package, under plain `pytest`

from benchmarks.fuzz_programs import tree_difference  # noqa: E402
from migrate.engine import Options, mentions_torch, run_rules  # noqa: E402
from migrate.safety.fallback import output_tree  # noqa: E402
from migrate.suppression import skip_lines  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
INPUTS = sorted(p for p in FIXTURES.rglob("*.py") if ".out." not in p.name and "/out/" not in p.as_posix())


def _rewritten(path: Path) -> tuple[cst.Module, str] | None:
    text = path.read_text()
    if not mentions_torch(text):
        return None
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return None
    skip_file, skipped = skip_lines(text)
    attempt = run_rules(module, text, str(path), Options(), skipped) if not skip_file else None
    if attempt is None or attempt.new_module is None or attempt.new_text is None:
        return None
    return attempt.new_module, attempt.new_text


def test_fixtures_reach_rewrites() -> None:
    rewritten = [p for p in INPUTS if _rewritten(p) is not None]
    assert len(rewritten) >= 150, len(rewritten)  # the invariant below is checked on real rewrites


@pytest.mark.parametrize("path", INPUTS, ids=[p.relative_to(FIXTURES).as_posix() for p in INPUTS])
def test_the_rewritten_tree_is_the_parse_of_its_code(path: Path) -> None:
    found = _rewritten(path)
    if found is None:
        pytest.skip("no rewrite")
    tree, text = found
    checked = output_tree(tree)
    # A node in two places would make the checks parse the text instead (sound, tested below, but a
    # parse is most of what a file costs): the rules place fresh nodes (`deep_clone`) when they copy.
    assert checked is tree, "a rule put one node object in two places of the output"
    assert tree_difference(tree, cst.parse_module(text)) is None


def test_a_node_in_two_places_makes_the_checks_parse_the_text() -> None:
    name = cst.Name("x")
    shared = cst.Module(body=[cst.SimpleStatementLine([cst.Expr(name)]), cst.SimpleStatementLine([cst.Expr(name)])])
    assert output_tree(shared) is None
    fresh = cst.parse_module("x\nx\n")
    assert output_tree(fresh) is fresh


def test_tree_difference_sees_a_changed_structure() -> None:
    # the printed code of a tree built without parentheses parses as another tree
    product = cst.BinaryOperation(
        left=cst.BinaryOperation(cst.Name("a"), cst.Add(), cst.Name("b")), operator=cst.Multiply(), right=cst.Name("c"))
    tree = cst.Module(body=[cst.SimpleStatementLine([cst.Expr(product)])])
    assert tree.code == "a + b * c\n"
    assert tree_difference(tree, cst.parse_module(tree.code)) is not None
