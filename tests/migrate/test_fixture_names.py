"""Golden outputs must also define or import every name they use.

A rewrite that emits `accelerator.backward(...)` in a function that cannot see `accelerator`, or
`Accelerator()` without its import, compiles fine and fails at run time; symtable finds it.
"""

from __future__ import annotations

import builtins
import symtable
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
# Every output of the full rule set (a `--select` case is deliberately partial).
OUTPUTS = sorted(
    p
    for p in FIXTURES.glob("*/*.out.py")
    if "--select" not in p.with_name(p.name.replace(".out.py", ".in.py")).read_text().split("\n", 1)[0]
)


def undefined_names(code: str, filename: str) -> set[str]:
    """Global names read somewhere in `code` that the module never binds or imports."""
    top = symtable.symtable(code, filename, "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    defined |= set(dir(builtins)) | {"__file__", "__name__"}
    missing: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (symbol.is_global() or table is top) and symbol.get_name() not in defined:
                missing.add(symbol.get_name())
        for child in table.get_children():
            walk(child)

    walk(top)
    return missing


@pytest.mark.parametrize("output", OUTPUTS, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.out.py')}")
def test_output_defines_every_name_it_uses(output: Path) -> None:
    source = output.with_name(output.name.replace(".out.py", ".in.py")).read_text()
    before = undefined_names(source, "in")
    after = undefined_names(output.read_text(), str(output))
    assert after <= before, f"the migration introduced undefined names: {sorted(after - before)}"


def test_checker_finds_a_missing_accelerator() -> None:
    code = "def train(loss):\n    accelerator.backward(loss)\n"
    assert undefined_names(code, "x") == {"accelerator"}
