"""`migrate.transform.Transformer` transforms like libcst's `CSTTransformer`, on every fixture."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.transform import Transformer

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted(FIXTURES.rglob("*.in.py"))


class _Renames:
    """`x` -> `x_`, calls wrapped in `wrap(...)`, `if` tests negated, a visit that skips lambdas."""

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=updated_node.value + "_")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        return cst.Call(func=cst.Name("wrap"), args=[cst.Arg(updated_node)])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        return updated_node.with_changes(test=cst.UnaryOperation(cst.Not(), updated_node.test))


class _Theirs(_Renames, cst.CSTTransformer):
    pass


class _Ours(_Renames, Transformer):
    pass


@pytest.mark.parametrize("case", CASES[::4], ids=[str(c.relative_to(FIXTURES)) for c in CASES[::4]])
def test_transformer_gives_libcsts_output(case: Path) -> None:
    module = cst.parse_module(case.read_text())
    assert module.visit(_Ours()).code == module.visit(_Theirs()).code


def test_per_field_hooks_are_refused() -> None:
    with pytest.raises(TypeError, match="per-field hooks"):
        type("Hooked", (Transformer,), {"visit_Call_func": lambda self, node: None})
