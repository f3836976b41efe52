"""The safety checks skip work that cannot change their verdict (each check's module docstring
says why). Here every shortcut is turned off and on again, and the verdicts (lines and messages)
must be the same: on every fixture's input with its golden output, and on outputs broken on
purpose so that the checks do find something (a string device rebound to `accelerator.device`)."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from migrate.safety import CheckContext, device_type
from tests.migrate.test_safety_device import DEVICE, STRING, STRING_USES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PAIRS = sorted(FIXTURES.glob("*/*.out.py"))


class _StringsToDevices(cst.CSTTransformer):
    """Rebinds every name bound to a string (`_stringy`) to `accelerator.device`: what a wrong
    device rewrite would do; with `use`, the next line also uses the name as a string."""

    def __init__(self, use: bool) -> None:
        super().__init__()
        self.use = use

    def leave_SimpleStatementLine(  # type: ignore[override]
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine | cst.FlattenSentinel[cst.SimpleStatementLine]:
        small = updated_node.body[0]
        if len(updated_node.body) != 1 or type(small) is not cst.Assign or not device_type._stringy(small.value):
            return updated_node
        line = updated_node.with_changes(body=[small.with_changes(value=cst.parse_expression("accelerator.device"))])
        target = small.targets[0].target
        if not self.use or type(target) is not cst.Name:
            return line
        return cst.FlattenSentinel([line, cst.parse_statement(f'on_gpu = "cuda" in {target.value}\n')])


def _cases() -> list[tuple[str, str, str]]:
    """(id, input, output): each fixture with its golden output, and with its strings made devices."""
    cases = []
    for out in PAIRS:
        name = f"{out.parent.name}/{out.name.removesuffix('.out.py')}"
        before = out.with_name(out.name.replace(".out.py", ".in.py")).read_text()
        cases.append((name, before, out.read_text()))
        try:
            module = cst.parse_module(before)
        except cst.ParserSyntaxError:
            continue
        for use in (False, True):
            broken = module.visit(_StringsToDevices(use)).code
            if broken != before:
                cases.append((f"{name} (strings made devices{', used as strings' if use else ''})", before, broken))
    for use, code in STRING_USES.items():
        cases.append((f"string use: {use}", STRING + code, DEVICE + code))
    return cases


CASES = _cases()


def _verdict(check, before: str, after: str) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    context = CheckContext("x.py", cst.parse_module(before), cst.parse_module(after), before, after, None)
    return [(v.line, v.message) for v in check(context)]


def test_the_broken_outputs_are_caught() -> None:
    found = [name for name, before, after in CASES if _verdict(device_type.check, before, after)]
    assert len(found) >= 5, found  # the comparisons below include real findings


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_device_type_without_the_binding_shortcut(case: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, before, after = case
    fast = _verdict(device_type.check, before, after)
    monkeypatch.setattr(device_type._Module, "binds_strings", lambda self: True)
    monkeypatch.setattr(device_type._Module, "binds_devices", lambda self: True)
    assert _verdict(device_type.check, before, after) == fast


# -- names-defined (AM104): the import patterns searched from their literal word ----------------

_IMPORT_TEXTS = [
    "from a import *\n", "from a import*\n", "ximport *\n", "x.import *\n", "_import *\n", "import *", "import\t*",
    "import os\n", "  import os.path, torch.distributed as dist  # c\n", "\timport a.b; import c.d\n",
    "# import x.y\n", "importx.y\n", "a = 1; import b.c\n", "s = 'import a.b'\nimport c.d\n", "import a.b\\\n  , c.d\n",
    "x = 1\n\n    import q.r\nimport", "import import a.b\n", "é import *\n", "éimport *\n",
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_import_patterns_from_their_word(case: tuple[str, str, str]) -> None:
    from migrate.safety.names_defined import _IMPORT_LINE, _STAR, _import_lines, _star_import

    for text in (*case[1:], *_IMPORT_TEXTS):
        assert _star_import(text) == (_STAR.search(text) is not None), text
        assert [m.span(1) for m in _import_lines(text)] == [m.span(1) for m in _IMPORT_LINE.finditer(text)], text

