"""The work a unit shares between its entries and the second run of its checks
(`migrate/crossmodule/unit.py`): each module is analysed once, not once per use, and the results
are those of analysing it afresh for every use (the repositories of fixtures/repos, and written
units with two entries sharing a module and a function imported under another name)."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from migrate.crossmodule import unit
from migrate.engine import Options
from migrate.runner import run
from migrate.statement_code import StatementCode

REPOS = Path(__file__).resolve().parents[2] / "fixtures" / "repos"

UTILS = """\
import torch


def scaled(loss):
    return loss * 1.0
"""

ENGINE = """\
import torch
from utils import scaled


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        loss = scaled(torch.nn.functional.mse_loss(model(x), y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""

MAIN = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
from engine import train_one_epoch{alias}

if __name__ == "__main__":
    model = torch.nn.Linear(4, 1).to("cuda")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)
    for epoch in range(2):
        {call}(model, loader, optimizer)
"""

WRITTEN = {
    "one_entry_renamed": {"utils.py": UTILS, "engine.py": ENGINE, "main.py": MAIN.format(alias=" as step", call="step")},
    "two_entries": {
        "utils.py": UTILS,
        "engine.py": ENGINE,
        "main.py": MAIN.format(alias="", call="train_one_epoch"),
        "other.py": MAIN.format(alias=" as step", call="step"),
    },
}


def _repos(tmp_path: Path) -> list[Path]:
    repos = []
    for source in sorted(REPOS.glob("*/in")):
        repos.append(tmp_path / source.parent.name)
        shutil.copytree(source, repos[-1])
    for name, files in WRITTEN.items():
        for file, text in files.items():
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / file).write_text(text)
        repos.append(tmp_path / name)
    return repos


def _report(repo: Path) -> list[tuple[object, ...]]:
    return [(r.path, r.new_text, r.changes, r.diagnostics, r.parsed, r.error)
            for r in run([repo], Options(), write=False).results]


def test_each_module_is_analysed_as_if_afresh_for_every_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repos = _repos(tmp_path)
    shared = [_report(repo) for repo in repos]
    parse = unit._parse

    def afresh(path, parsed):  # type: ignore[no-untyped-def]
        item = parsed.items.get(path)
        if item is not None:
            item.renamed = True  # analysed again, as if the view had changed its facts
        parsed.facts.clear()
        return parse(path, parsed)

    monkeypatch.setattr(unit, "_parse", afresh)
    assert [_report(repo) for repo in repos] == shared
    assert any(r[1] is not None for report in shared for r in report)  # some unit was migrated


def test_a_unit_analyses_each_module_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _repos(tmp_path)[-1]  # two entries sharing engine.py and utils.py, one renaming its function
    analysed: list[str | None] = []
    analyze = unit.analyze

    def counted(module, text=None):  # type: ignore[no-untyped-def]
        analysed.append(text)
        return analyze(module, text)

    monkeypatch.setattr(unit, "analyze", counted)
    report = {Path(r[0]).name: r for r in _report(repo)}
    assert report["engine.py"][1] is not None and report["utils.py"][1] is None
    # utils.py is never rewritten: one analysis for both entries and the second runs of their
    # checks; engine.py (rewritten) once for both entries
    assert analysed.count(UTILS) == 1
    assert analysed.count(ENGINE) == 1
    # other.py imports `train_one_epoch as step`: its view renames its call sites, so any later
    # use analyses it again
    assert analysed.count(MAIN.format(alias=" as step", call="step")) >= 2


FIXTURES = REPOS.parent


@pytest.mark.parametrize("suffix", [".in.py", ".out.py"])
def test_statement_code_is_module_code_on_every_fixture(suffix: str) -> None:
    import libcst as cst

    from migrate.imports import add_imports

    sources = [*sorted(FIXTURES.rglob(f"*{suffix}")), *(sorted(REPOS.rglob("*.py")) if suffix == ".in.py" else [])]
    extra = ["", "\n", "# only a comment", "x = 1", "x = 1\n\n\n# trailing comment\n", "def f():\n    pass\n\n\n",
             "import os\r\nx = 1\r\n", "if x:\n\ty = 1\n"]
    texts = [p.read_text() for p in sources] + extra + _LAYOUTS
    modules = [cst.parse_module(t) for t in texts]
    assert len(modules) > 100
    for text, module in zip(texts, modules):
        with_imports = add_imports(module, {("accelerate", "Accelerator"), ("os", "path")})
        for code in (StatementCode(), StatementCode(module, text)):
            assert code(module) == module.code
            assert code(with_imports) == with_imports.code


# Layouts where a top-level statement's lines are not its physical lines alone: continuations,
# strings spanning lines, other newlines, comments before and after, no trailing newline.
_LAYOUTS = [
    "x = (1,\n     2)\ny = 3 \\\n    + 4\n",
    's = """a\nb\r\nc"""\nt = 1\n',
    "a = 1\rb = 2\r",
    "a = 1\rb = 2\r\n",
    's = """a\rb"""\nt = (1,\r2)\n',
    "x = 1\n\r\n\ry = 2\n",
    "a = 1\r\n\r\nif a:\r\n    b = 2\r\n",
    "\x0c\nx = 1\n\x0c\n",
    "# head\n\n@dec\n# between\ndef f():\n    return 1\n    # inner tail\n# tail\n\n",
    "class A:\n    x = 1\n\n    def f(self): pass\nclass B: pass\n",
    "x = 1; y = 2\nif x: z = 3\nelse:\n  z = 4\n",
    "x = 1",
    "\ufeffx = 1\n",
]


def _fixture_texts() -> list[str]:
    return [p.read_text() for p in sorted(FIXTURES.rglob("*.py")) if "/out/" not in p.as_posix()] + _LAYOUTS


def test_statement_texts_are_the_code_of_each_top_level_item() -> None:
    """`statement_texts` cuts each top-level item's code from the source: equal to libcst's code
    for that item, on every fixture and layout it accepts."""
    import libcst as cst

    from migrate.positions import statement_texts

    cut = 0
    for text in _fixture_texts():
        module = cst.parse_module(text)
        texts = statement_texts(module, text)
        if texts is None:
            # (libcst reads a last lone "\r" as no trailing newline: left to libcst)
            assert text.startswith("\ufeff") or not text.strip() or not module.has_trailing_newline and text.endswith("\r"), text
            continue
        cut += 1
        items = (*module.header, *module.body, *module.footer)
        assert [texts[id(item)] for item in items] == [module.code_for_node(item) for item in items]
        # without a trailing newline, the last item's code ends with the newline libcst adds
        assert "".join(texts.values()) == text + ("" if module.has_trailing_newline else module.default_newline)
    assert cut > 400


_NO_TRAILING_NEWLINE = ["x = 1\ny = 2", "x = 1\r\ny = 2", "x=1\r\ny=2\n# tail", "x = 1\nif x:\n    y = 2",
                        "a = 1\rb = 2", "x = 1\n   ", "import os\n\n\ndef f():\n    return 1  # end"]


@pytest.mark.parametrize("text", _NO_TRAILING_NEWLINE)
def test_statement_code_without_a_trailing_newline(text: str) -> None:
    """A module without a trailing newline (libcst drops the last newline token of its code):
    kept, replaced and removed last items, a new last item ending with a statement it kept, and
    imports added, give `Module.code`."""
    import libcst as cst

    from migrate.imports import add_imports

    module = cst.parse_module(text)
    assert not module.has_trailing_newline
    body = list(module.body)
    variants = [
        module,
        add_imports(module, {("accelerate", "Accelerator")}),
        module.with_changes(body=[*body[:-1], cst.parse_statement("z = 3  # new\n")]),
        module.with_changes(body=body[:-1]),
        module.with_changes(body=[*body, cst.parse_statement("if z:\n    w = 4\n")]),
    ]
    last = body[-1]
    if type(last) in (cst.If, cst.FunctionDef):  # a new last item ending with a kept statement
        block = last.body  # type: ignore[attr-defined]
        new_block = block.with_changes(body=[cst.parse_statement("v = 0\n"), *block.body])
        variants.append(module.with_changes(body=[*body[:-1], last.with_changes(body=new_block)]))
    code = StatementCode(module, text)
    for variant in variants:
        assert code(variant) == variant.code
        assert StatementCode()(variant) == variant.code
    assert code(module) == text


def test_statement_code_of_a_rewrite_is_module_code_on_every_fixture() -> None:
    """The rules' rewrite of each fixture keeps most statements (the same node objects): their
    code is cut from the source, and the whole is the rewritten module's code."""
    import libcst as cst

    from migrate.engine import Options, mentions_torch, run_rules
    from migrate.suppression import skip_lines

    rewritten = 0
    for text in _fixture_texts():
        if not mentions_torch(text):
            continue
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError:
            continue
        skip_file, skipped = skip_lines(text)
        attempt = None if skip_file else run_rules(module, text, "x.py", Options(), skipped)
        if attempt is None or attempt.new_module is None:
            continue
        rewritten += 1
        assert StatementCode(module, text)(attempt.new_module) == attempt.new_module.code
    assert rewritten > 100


def test_a_unit_parses_each_module_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second run of an entry's checks reaches every entry of the unit, also modules that the
    first run has not parsed yet (another entry's own modules): the two runs share those trees,
    whichever parses first."""
    import libcst as cst

    engine2 = ENGINE.replace("import torch\n", "import torch\nimport math\n", 1)
    files = {"utils.py": UTILS, "engine.py": ENGINE, "engine2.py": engine2,
             "main.py": MAIN.format(alias="", call="train_one_epoch"),
             "other.py": MAIN.replace("from engine import", "from engine2 import").format(alias=" as step", call="step")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    parsed: list[str] = []
    parse = cst.parse_module

    def counted(text, *args, **kwargs):  # type: ignore[no-untyped-def]
        parsed.append(text)
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(cst, "parse_module", counted)
    report = {Path(r[0]).name: r for r in _report(tmp_path)}
    assert report["main.py"][1] is not None and report["other.py"][1] is not None  # both entries migrated
    for name, text in files.items():
        assert parsed.count(text) == 1, name


def test_inner_statement_texts_are_the_code_of_each_inner_statement() -> None:
    """`inner_statement_texts` cuts the statements of the blocks inside a top-level compound
    statement from its code: each equals libcst's code for it, generated at the indentation it has
    there, on every fixture and layout: every simple statement at every depth; the statements of
    the first block (compound ones whole); the last statement alone, with only the statements
    around it opened; each with and without the line counts `start_lines` records on its way."""
    import libcst as cst
    from libcst._nodes.internal import CodegenState

    from migrate.positions import _PARTS, _line_count, inner_statement_texts, start_lines, statement_texts
    from migrate.statement_code import _index

    cut = 0
    for text in _fixture_texts():
        module = cst.parse_module(text)
        texts = statement_texts(module, text)
        if texts is None:
            continue
        for item in module.body:
            if type(item) not in _PARTS:
                continue
            owners: dict[int, tuple[cst.CSTNode, cst.CSTNode]] = {}
            _index(item, item, owners)
            blocks = [stmt for block in walk_blocks(item) for stmt in block]
            if not blocks:
                continue
            last = blocks[-1]
            enclosing, parent = {id(item)}, owners[id(last)][1]
            while id(parent) != id(item):
                enclosing.add(id(parent))
                parent = owners[id(parent)][1]
            everything = {id(parent) for _, parent in owners.values()}
            simple = {id(stmt) for stmt in blocks if type(stmt) not in _PARTS}
            first = {id(stmt) for stmt in walk_blocks(item)[0]}  # compound ones cut whole
            # the line counts the placing walk records on its way to a node (here: the last one)
            counts: dict[int, int] = {}
            start_lines(module, [last], counts)
            for stmt in blocks:
                assert counts.get(id(stmt), _line_count(stmt)) == _line_count(stmt)
            for (wanted, opened), known in itertools.product(
                    ((simple, everything), (first, everything), ({id(last)}, enclosing)), (None, counts)):
                found = inner_statement_texts(item, texts[id(item)], wanted, opened, module.default_indent, known)
                assert found is not None and set(found) == wanted
                for node, code, indent in found.values():
                    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
                    state.indent_tokens = [indent]
                    node._codegen(state)
                    assert "".join(state.tokens) == code
                    cut += 1
    assert cut > 1000


def walk_blocks(node: object) -> list[list[object]]:
    """The statement lists of every indented block under a compound statement, outermost first."""
    import libcst as cst

    from migrate.positions import _PARTS

    out: list[list[object]] = []
    parts = _PARTS.get(type(node))
    if parts is None:
        return out
    for block in parts[2](node):  # type: ignore[arg-type]
        for value in block if isinstance(block, (tuple, list)) else (block,):
            if type(value) is cst.IndentedBlock:
                out.append(list(value.body))
                for stmt in value.body:
                    out.extend(walk_blocks(stmt))
            else:
                out.extend(walk_blocks(value))
    return out


def test_statement_code_cuts_kept_inner_statements_only_at_their_indentation() -> None:
    """In a new function, a statement kept at its indentation is cut from the source (its odd
    spacing shows it), one moved into a new block is generated at the new indentation."""
    import libcst as cst

    text = "def f():\n    a  =  1  # kept\n    if a:\n        b  =  2\n    c  =  3\n"
    module = cst.parse_module(text)
    function = module.body[0]
    kept, branch, moved = function.body.body  # type: ignore[attr-defined]
    new = function.with_changes(body=function.body.with_changes(body=[  # type: ignore[attr-defined]
        kept,
        cst.parse_statement("d = 4\n"),
        branch,
        cst.If(test=cst.Name("a"), body=cst.IndentedBlock(body=[moved])),
    ]))
    rewritten = module.with_changes(body=[new])
    assert StatementCode(module, text)(rewritten) == rewritten.code == (
        "def f():\n    a  =  1  # kept\n    d = 4\n    if a:\n        b  =  2\n    if a:\n        c  =  3\n")


def test_a_check_reruns_only_the_entries_that_reach_a_rewritten_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two entries of one unit (they share utils.py, which neither rewrites), each migrating its
    own engine: the second run of an entry's checks reruns that entry only (the other reaches no
    file the first rewrote), and a rerun that changes nothing is not checked again. Each entry
    thus runs twice: before, each check also reran the other entry, with its own nested check."""
    engine2 = ENGINE.replace("import torch\n", "import torch\nimport math\n", 1)
    files = {"utils.py": UTILS, "engine.py": ENGINE, "engine2.py": engine2,
             "main.py": MAIN.format(alias="", call="train_one_epoch"),
             "other.py": MAIN.replace("from engine import", "from engine2 import").format(alias=" as step", call="step")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    runs: list[str] = []
    checks: list[str] = []
    migrate_entry, check = unit._migrate_entry, unit._check

    def counted_entry(entry, *args, **kwargs):  # type: ignore[no-untyped-def]
        runs.append(entry.name)
        return migrate_entry(entry, *args, **kwargs)

    def counted_check(outcome, *args, **kwargs):  # type: ignore[no-untyped-def]
        checks.append(",".join(sorted(p.name for p in outcome.results)))
        return check(outcome, *args, **kwargs)

    monkeypatch.setattr(unit, "_migrate_entry", counted_entry)
    monkeypatch.setattr(unit, "_check", counted_check)
    report = {Path(r[0]).name: r for r in _report(tmp_path)}
    for name in ("main.py", "other.py", "engine.py", "engine2.py"):
        assert report[name][1] is not None, name  # both entries migrated with their engines
    assert report["utils.py"][1] is None
    assert sorted(runs) == ["main.py", "main.py", "other.py", "other.py"]
    assert sorted(checks) == ["engine.py,main.py", "engine2.py,other.py"]


HIDDEN_STEP_ENGINE = """\
import torch
from fastscale import scaled_step


def train_one_epoch(model, loader, optimizer):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        scaled_step(loss, optimizer)
"""


def test_a_modules_own_run_takes_the_units_analysis_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The single-file run of a unit's module takes the analysis the unit made of it (when no view
    renamed its call sites and no roles marked a hidden step's loops in it), with the results of
    analysing it afresh: the repositories of fixtures/repos, the written units, and a unit whose
    view finds a training step inside an unread function (`scaled_step(loss, optimizer)`)."""
    from migrate import engine, runner

    repos = _repos(tmp_path)
    hidden = tmp_path / "hidden_step"
    hidden.mkdir()
    (hidden / "engine.py").write_text(HIDDEN_STEP_ENGINE)
    (hidden / "main.py").write_text(MAIN.format(alias="", call="train_one_epoch"))
    repos.append(hidden)
    stepped: list[bool] = []
    find_roles = unit.find_roles

    def watched(view):  # type: ignore[no-untyped-def]
        roles = find_roles(view)
        stepped.append(bool(roles.hidden_steps))
        return roles

    monkeypatch.setattr(unit, "find_roles", watched)
    analyses: list[int] = []
    analyze = engine.analyze
    monkeypatch.setattr(engine, "analyze", lambda module, text=None: analyses.append(1) or analyze(module, text))
    shared = [_report(repo) for repo in repos]
    assert any(stepped)  # the hidden step's unit is among them
    reused = len(analyses)
    migrate_text = runner.migrate_text
    monkeypatch.setattr(runner, "migrate_text", lambda text, display, options, module=None, facts=None:
                        migrate_text(text, display, options, module))
    analyses.clear()
    assert [_report(repo) for repo in repos] == shared
    assert reused < len(analyses)
