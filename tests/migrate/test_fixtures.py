"""Golden files: fixtures/<rule>/<case>.in.py -> <case>.out.py (absent: must stay unchanged).

Each case also checks that the output compiles, that a second run changes nothing, and that the
diagnostics match <case>.diagnostics (absent: none). A first line `# flags: ...` is parsed by the
CLI's own option parser. Regenerate with `pytest --update-fixtures` and review the diff.

Every case in a rule's folder (fixtures/<rule name with _>/) is about that rule: the file passes
the pre-filter and is parsed, the rule is enabled by its flags, and the case shows one of
- fires: a Change with the rule's code;
- declines: a Diagnostic with the rule's code (the rule's own reason for leaving it; the roles
  refusing the whole file count only when their diagnostic carries the rule's code, e.g. AM007 for
  `mp.spawn`);
- reached no-op: neither, the roles did not refuse the file (so every enabled rule ran on it), and
  no Diagnostic at all in the file (nothing declined anything: the rule ran over the file and
  found nothing to do, a case the rule must not misfire on).
A rule needs at least 3 cases that fire and 2 that do not (declines or reached no-ops). Cases
that no rule reaches (pre-filtered, or refused as a whole by the roles: test modules, library
modules) live in fixtures/whole_file/, whose every case must be one of those two. fixtures/pipeline
holds whole-script cases (all rules together) and fixtures/scripts the runnable end-to-end scripts.
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


NON_RULE_FOLDERS = {"pipeline", "scripts", "whole_file", "repos"}  # repos: tests/e2e/test_repos.py


def _folder(rule) -> Path:  # type: ignore[no-untyped-def]
    return FIXTURES / rule.name.replace("-", "_")


def _refused(text: str) -> bool:
    """Whether the roles refuse the parsed file as a whole (no rule then runs on it)."""
    import libcst as cst

    from migrate.analysis import analyze
    from migrate.roles import find_roles

    return bool(find_roles(analyze(cst.parse_module(text))).refused)


def case_kind(case: Path, code: str) -> str:
    """"fires", "declines" or "no-op" (see the module docstring), or why the case does not reach
    the rule `code`."""
    text = case.read_text()
    options = _options(text)
    if not options.enabled(code):
        return f"not reached: its flags disable {code}"
    result = migrate_source(text, str(case), options)
    if not result.parsed:
        return "not reached: pre-filtered or skipped (never parsed); move it to fixtures/whole_file/"
    if any(c.code == code for c in result.changes):
        return "fires"
    if any(d.code == code for d in result.diagnostics):
        return "declines"  # the rule's own reason, also when the roles refused the file for it (mp.spawn: AM007)
    if _refused(text):
        return "not reached: the roles refuse the whole file for another rule; move it to fixtures/whole_file/"
    if result.diagnostics:
        others = sorted({d.code for d in result.diagnostics})
        return f"not reached: no {code} change or diagnostic, and {', '.join(others)} declined something"
    return "no-op"


def _rule_cases() -> list:
    from migrate.registry import RULES

    return [
        pytest.param(case, rule.code, id=f"{rule.code}/{case.name.removesuffix('.in.py')}")
        for rule in RULES
        for case in sorted(_folder(rule).glob("*.in.py"))
    ]


@pytest.mark.parametrize("case, code", _rule_cases())
def test_every_case_reaches_its_rule(case: Path, code: str) -> None:
    assert case_kind(case, code) in ("fires", "declines", "no-op")


def test_every_rule_has_cases_that_fire_and_cases_that_do_not() -> None:
    from migrate.registry import RULES

    for rule in RULES:
        kinds = [case_kind(case, rule.code) for case in _folder(rule).glob("*.in.py")]
        fires = kinds.count("fires")
        others = kinds.count("declines") + kinds.count("no-op")
        assert fires >= 3, f"{rule.code} needs at least 3 cases in {_folder(rule)} where it fires (has {fires})"
        assert others >= 2, f"{rule.code} needs at least 2 cases in {_folder(rule)} it declines or leaves (has {others})"


def test_every_fixture_folder_belongs_to_a_rule() -> None:
    from migrate.registry import RULES

    folders = {p.name for p in FIXTURES.iterdir() if p.is_dir()}
    unknown = folders - NON_RULE_FOLDERS - {_folder(rule).name for rule in RULES}
    assert not unknown, f"fixture folders that name no rule (their cases would be checked for none): {sorted(unknown)}"


@pytest.mark.parametrize("case", sorted((FIXTURES / "whole_file").glob("*.in.py")), ids=lambda p: p.name.removesuffix(".in.py"))
def test_whole_file_cases_reach_no_rule(case: Path) -> None:
    text = case.read_text()
    result = migrate_source(text, str(case), _options(text))
    assert result.new_text is None and not result.changes
    assert not result.parsed or _refused(text), "a rule reaches this file: move it to that rule's folder"


def test_the_criterion_rejects_what_no_rule_reaches(tmp_path: Path) -> None:
    """The criterion above can fail: a pre-filtered file, a refused test module and a file that
    another rule declines are each not reached."""
    cases = {
        "prefiltered": "import torch\nprint(torch.ones(1))\n",
        "refused": "import unittest\nimport torch\n\nclass T(unittest.TestCase):\n    def test(self):\n"
        "        model = torch.nn.Linear(2, 1)\n        opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "        model(torch.ones(1, 2)).sum().backward()\n        opt.step()\n",
        "declined by AM003": "import torch\n\ndef step(model, batch, optimizer):\n    loss = model(batch).mean()\n"
        "    loss.backward()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n    optimizer.step()\n",
    }
    for label, text in cases.items():
        path = tmp_path / f"{label.replace(' ', '_')}.in.py"
        path.write_text(text)
        assert case_kind(path, "AM008").startswith("not reached"), label
