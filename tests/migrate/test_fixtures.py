"""Golden files: fixtures/<rule>/<case>.in.py -> <case>.out.py (absent: must stay unchanged).

Each case also checks that the output compiles, that a second run changes nothing, and that the
diagnostics match <case>.diagnostics (absent: none). A first line `# flags: ...` is parsed by the
CLI's own option parser. Regenerate with `pytest --update-fixtures` and review the diff.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from migrate.cli import options_from_flags
from migrate.engine import Options, migrate_source

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CASES = sorted(p for p in FIXTURES.glob("*/*.in.py") if p.parent.name != "scripts")


def _options(text: str) -> Options:
    first = text.splitlines()[0] if text else ""
    if first.startswith("# flags:"):
        return options_from_flags(shlex.split(first.removeprefix("# flags:")))
    return Options()


def _diagnostics_text(result) -> str:  # type: ignore[no-untyped-def]
    return "".join(f"{d.line}: {d.code} {d.message}\n" for d in result.diagnostics)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name.removesuffix('.in.py')}")
def test_fixture(case: Path, request: pytest.FixtureRequest) -> None:
    text = case.read_text()
    options = _options(text)
    result = migrate_source(text, str(case), options)
    assert result.error is None, result.error
    output = result.new_text if result.new_text is not None else text
    out_path = case.with_name(case.name.replace(".in.py", ".out.py"))
    diag_path = case.with_name(case.name.replace(".in.py", ".diagnostics"))
    diagnostics = _diagnostics_text(result)

    if request.config.getoption("--update-fixtures"):
        _write_or_remove(out_path, output if output != text else None)
        _write_or_remove(diag_path, diagnostics or None)
        pytest.fail("fixtures updated: review `git diff fixtures/` and run again without --update-fixtures")

    expected = out_path.read_text() if out_path.exists() else text
    assert output == expected
    assert diagnostics == (diag_path.read_text() if diag_path.exists() else "")
    compile(output, str(out_path), "exec")
    again = migrate_source(output, str(out_path), options)
    assert again.new_text is None, "a second run must change nothing"


def _write_or_remove(path: Path, content: str | None) -> None:
    if content is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(content)


def test_every_rule_has_rewrite_and_leave_alone_cases() -> None:
    from migrate.registry import RULES

    for rule in RULES:
        folder = FIXTURES / rule.name.replace("-", "_")
        cases = list(folder.glob("*.in.py"))
        rewritten = [c for c in cases if c.with_name(c.name.replace(".in.py", ".out.py")).exists()]
        left_alone = [c for c in cases if c not in rewritten]
        assert len(rewritten) >= 3, f"{rule.code} needs at least 3 rewrite cases in {folder}"
        assert len(left_alone) >= 2, f"{rule.code} needs at least 2 leave-alone cases in {folder}"
