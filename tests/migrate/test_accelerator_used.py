"""An `accelerator` the migration hands to a function or class is used there.

A rule that requests the accelerator for a scope (`EditPlan.use_accelerator`) must attach an edit
that uses it; otherwise AM001 threads a parameter nobody reads (`MetricLogger(accelerator=...)`
stored as `self.accelerator` and never read). Checked on every golden output."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
OUTPUTS = sorted([*FIXTURES.rglob("*.out.py"), *FIXTURES.glob("repos/*/out/**/*.py")])


def _unused(tree: ast.Module) -> list[str]:
    """Functions taking `accelerator` that never read it, and classes storing `self.accelerator`
    that never read it back."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            if "accelerator" not in params:
                continue
            reads = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == "accelerator"
                     and isinstance(n.ctx, ast.Load)]
            if not reads:
                found.append(f"{node.name}:{node.lineno} takes `accelerator` and never reads it")
        elif isinstance(node, ast.ClassDef):
            stores = loads = 0
            for sub in ast.walk(node):
                if (isinstance(sub, ast.Attribute) and sub.attr == "accelerator"
                        and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                    if isinstance(sub.ctx, ast.Store):
                        stores += 1
                    else:
                        loads += 1
            if stores and not loads:
                found.append(f"class {node.name}:{node.lineno} stores `self.accelerator` and never reads it")
    return found


@pytest.mark.parametrize("path", OUTPUTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_accelerator_handed_in_is_used(path: Path) -> None:
    source = path.read_text()
    if "accelerator" not in source:
        return
    assert _unused(ast.parse(source)) == []
