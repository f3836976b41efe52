"""Hypothesis strategies for generated training programs, recombined from our own fixture scripts.

What it does:
    Parses every `fixtures/**/*.in.py` and `fixtures/scripts/*.py` once (our own code) and builds
    programs from their statements: the imports of one to three source files, then statements drawn
    from their module bodies and function bodies (mostly in order, some dropped, some swapped, some
    borrowed from the other sources), identifiers renamed consistently, slices nested in
    `def`/`class`/`if`/`for`/`while`/`with`/`try`, comments on their own lines, at line ends and inside
    call arguments, and odd formatting: semicolons, redundant parentheses, backslash continuations,
    blank lines, tab indentation, CRLF newlines. Every program compiles (others are rejected with
    `hypothesis.assume`).

Why:
    The golden fixtures pin what each rule does on shapes we thought of; recombined programs reach
    the shapes in between (a loop inside a `with` inside a class body, a renamed optimizer, a
    comment between call arguments), where a rule could produce invalid Python, a script that
    fails the safety checks, or a rewrite that is not a fixed point.

Used by `tests/migrate/test_fuzz_codemod.py` (bounded, derandomized, in CI) and `benchmarks/fuzz.py`
(the long run). `without_training_code` strips what makes a program a training script.
"""

from __future__ import annotations

import builtins
import keyword
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import libcst as cst
from hypothesis import assume
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"

_RESERVED = set(dir(builtins)) | set(keyword.kwlist) | {"self", "cls", "__name__", "__file__"}
_COMMENTS = ("# note", "# TODO: tune", "# noqa", "#", "# type: ignore", "# loss.backward() here?", "# é ünïcode")


@dataclass(frozen=True)
class Source:
    """One parsed fixture: its import statements and its other statements (module and function level)."""

    name: str
    imports: tuple[cst.BaseStatement, ...]
    module_body: tuple[cst.BaseStatement, ...]
    function_body: tuple[cst.BaseStatement, ...]


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
    )


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _function_statements(module: cst.Module) -> list[cst.BaseStatement]:
    found: list[cst.BaseStatement] = []

    class Collect(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            if isinstance(node.body, cst.IndentedBlock):
                found.extend(s for s in node.body.body if not _is_docstring(s))

    module.visit(Collect())
    return found


@lru_cache(maxsize=1)
def sources() -> tuple[Source, ...]:
    paths = sorted(FIXTURES.glob("**/*.in.py")) + sorted((FIXTURES / "scripts").glob("*.py"))
    loaded = []
    for path in paths:
        try:
            module = cst.parse_module(path.read_text(encoding="utf-8"))
        except (cst.ParserSyntaxError, UnicodeDecodeError):
            continue
        body = [s.with_changes(leading_lines=()) for s in module.body if not _is_docstring(s)]
        loaded.append(
            Source(
                name=str(path.relative_to(ROOT)),
                imports=tuple(s for s in body if _is_import(s)),
                module_body=tuple(s for s in body if not _is_import(s)),
                function_body=tuple(s.with_changes(leading_lines=()) for s in _function_statements(module)),
            )
        )
    return tuple(loaded)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# ---- transformations --------------------------------------------------------------------------


class _Names(cst.CSTVisitor):
    """Identifiers a program binds (assignments, loops, defs, parameters, with-as), not imports."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.imported: set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.bound.add(node.value)

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        name = node.asname.name if node.asname else node.name
        for part in _code(name).replace(" ", "").split("."):
            self.imported.add(part)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False  # `.attr` names are not variables

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False  # `keyword=` names belong to the callee


class _Rename(cst.CSTTransformer):
    """Rename variables consistently; attribute names, call keywords and imports stay."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping
        self.keep = 0

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return True

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        return updated.with_changes(value=self.mapping.get(updated.value, updated.value))


def rename(statements: list[cst.BaseStatement], imports: list[cst.BaseStatement], pick) -> list[cst.BaseStatement]:  # type: ignore[no-untyped-def]
    names = _Names()
    for statement in imports + statements:
        statement.visit(names)
    candidates = sorted(names.bound - names.imported - _RESERVED)
    chosen = pick(candidates)
    if not chosen:
        return statements
    taken = names.bound | names.imported
    mapping = {}
    for index, name in enumerate(chosen):
        new = f"{name}_r{index}" if index % 2 else f"v{index}_{name[:3]}"
        while new in taken:
            new += "_"
        taken.add(new)
        mapping[name] = new
    transformer = _Rename(mapping)
    return [s.visit(transformer) for s in statements]  # type: ignore[misc]


def _block(body: list[cst.BaseStatement], indent: str | None) -> cst.IndentedBlock:
    return cst.IndentedBlock(body=body or [cst.SimpleStatementLine([cst.Pass()])], indent=indent)


def nest(body: list[cst.BaseStatement], kind: str, index: int, indent: str | None) -> list[cst.BaseStatement]:
    """`body` inside one compound statement (a def is also called, a class body stays a class body)."""
    block = _block(body, indent)
    if kind == "def":
        name = f"fuzz_block_{index}"
        return [
            cst.FunctionDef(name=cst.Name(name), params=cst.Parameters(), body=block),
            cst.SimpleStatementLine([cst.Expr(cst.parse_expression(f"{name}()"))]),
        ]
    if kind == "class":
        return [cst.ClassDef(name=cst.Name(f"FuzzBlock{index}"), body=block)]
    if kind == "if":
        return [cst.If(test=cst.parse_expression("True"), body=block)]
    if kind == "if-else":
        return [
            cst.If(
                test=cst.parse_expression("__name__ == '__main__'"),
                body=block,
                orelse=cst.Else(_block([cst.SimpleStatementLine([cst.Pass()])], indent)),
            )
        ]
    if kind == "for":
        return [cst.For(target=cst.Name(f"_fuzz_{index}"), iter=cst.parse_expression("range(1)"), body=block)]
    if kind == "while":
        return [cst.While(test=cst.parse_expression("True"), body=_block(body + [cst.SimpleStatementLine([cst.Break()])], indent))]
    if kind == "with":
        item = cst.WithItem(cst.parse_expression("contextlib.nullcontext()"))
        return [
            cst.SimpleStatementLine([cst.Import(names=[cst.ImportAlias(cst.Name("contextlib"))])]),
            cst.With(items=[item], body=block),
        ]
    if kind == "try":
        handler = cst.ExceptHandler(
            body=_block([cst.SimpleStatementLine([cst.Raise()])], indent), type=cst.Name("Exception")
        )
        return [cst.Try(body=block, handlers=[handler])]
    raise ValueError(kind)


NEST_KINDS = ("def", "class", "if", "if-else", "for", "while", "with", "try")


class _Format(cst.CSTTransformer):
    """Odd but valid formatting and comments, each site chosen by a draw (`choose(site) -> bool`)."""

    def __init__(self, choose) -> None:  # type: ignore[no-untyped-def]
        self.choose = choose

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if self.choose("line-comment") and updated.trailing_whitespace.comment is None:
            comment = cst.Comment(self.choose.comment())
            updated = updated.with_changes(
                trailing_whitespace=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=comment)
            )
        leading = list(updated.leading_lines)
        if self.choose("comment-above"):
            leading.append(cst.EmptyLine(comment=cst.Comment(self.choose.comment())))
        if self.choose("blank-line"):
            leading.insert(0, cst.EmptyLine())
        return updated.with_changes(leading_lines=leading)

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        if self.choose("backslash") and len(updated.targets) == 1:
            target = updated.targets[0].with_changes(whitespace_after_equal=cst.SimpleWhitespace(" \\\n    "))
            updated = updated.with_changes(targets=[target])
        value = updated.value
        if self.choose("parens") and hasattr(value, "lpar") and not value.lpar:
            updated = updated.with_changes(value=value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not updated.args or not self.choose("arg-comments"):
            return updated
        args = list(updated.args)
        broken = cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.choose.comment())
            ),
            indent=True,
            last_line=cst.SimpleWhitespace("    "),
        )
        if updated.args[-1].comma == cst.MaybeSentinel.DEFAULT or len(args) == 1:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=broken))
        else:
            args[0] = args[0].with_changes(comma=cst.Comma(whitespace_after=broken))
        return updated.with_changes(args=args, whitespace_before_args=broken)

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = list(updated.body)
        merged: list[cst.BaseStatement] = []
        for statement in body:  # semicolons: two simple lines as one
            if (
                merged
                and isinstance(statement, cst.SimpleStatementLine)
                and isinstance(merged[-1], cst.SimpleStatementLine)
                and merged[-1].trailing_whitespace.comment is None
                and not statement.leading_lines
                and self.choose("semicolon")
            ):
                last = merged[-1]
                merged[-1] = last.with_changes(body=[*last.body, *statement.body], trailing_whitespace=statement.trailing_whitespace)
                continue
            merged.append(statement)
        if self.choose("block-comment"):
            footer = [*updated.footer, cst.EmptyLine(indent=True, comment=cst.Comment(self.choose.comment()))]
            return updated.with_changes(body=merged, footer=footer)
        return updated.with_changes(body=merged)


class _Chooser:
    def __init__(self, draw, rate: float) -> None:  # type: ignore[no-untyped-def]
        self.draw = draw
        self.rate = rate

    def __call__(self, site: str) -> bool:
        if self.rate <= 0:
            return False
        return self.draw(st.integers(0, 99), label=site) < self.rate * 100

    def comment(self) -> str:
        return self.draw(st.sampled_from(_COMMENTS))


# ---- the strategy -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    text: str
    origin: tuple[str, ...]  # the fixture files its statements came from

    def __repr__(self) -> str:  # hypothesis prints this for a falsifying example
        return f"Program(origin={self.origin!r}, text=\n{self.text})"


def _dedupe(imports: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    seen: set[str] = set()
    kept = []
    for statement in imports:
        code = _code(statement)
        if code not in seen:
            seen.add(code)
            kept.append(statement)
    return kept


@st.composite
def programs(draw) -> Program:  # type: ignore[no-untyped-def]
    pool = sources()
    count = draw(st.integers(1, 3), label="sources")
    chosen = draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count, unique_by=lambda s: s.name))
    primary = chosen[0]
    imports = _dedupe([s for source in chosen for s in source.imports])
    statements = list(primary.module_body)
    if draw(st.booleans(), label="function bodies"):
        statements += list(primary.function_body)
    for other in chosen[1:]:
        borrowed = list(other.module_body) + list(other.function_body)
        picks = draw(st.lists(st.sampled_from(borrowed), max_size=6)) if borrowed else []
        for statement in picks:
            statements.insert(draw(st.integers(0, len(statements))), statement)
    # drop some, swap some neighbours
    keep = draw(st.lists(st.booleans(), min_size=len(statements), max_size=len(statements)), label="drop")
    statements = [s for s, k in zip(statements, keep) if k or draw(st.integers(0, 3)) > 0]
    for _ in range(draw(st.integers(0, 3), label="swaps")):
        if len(statements) > 1:
            i = draw(st.integers(0, len(statements) - 2))
            statements[i], statements[i + 1] = statements[i + 1], statements[i]
    assume(statements)

    def pick(candidates: list[str]) -> list[str]:
        if not candidates or not draw(st.booleans(), label="rename"):
            return []
        return draw(st.lists(st.sampled_from(candidates), unique=True, max_size=8))

    statements = rename(statements, imports, pick)

    indent = draw(st.sampled_from([None, None, "\t", "  "]), label="indent")
    for index in range(draw(st.integers(0, 3), label="nestings")):
        start = draw(st.integers(0, len(statements) - 1))
        end = draw(st.integers(start + 1, len(statements)))
        kind = draw(st.sampled_from(NEST_KINDS))
        statements[start:end] = nest(statements[start:end], kind, index, indent)

    if imports and draw(st.integers(0, 5), label="imports in a try") == 0:
        handler = cst.ExceptHandler(body=_block([cst.SimpleStatementLine([cst.Raise()])], indent), type=cst.Name("ImportError"))
        imports = [cst.Try(body=_block(imports, indent), handlers=[handler])]
    body = imports + statements
    module = cst.Module(body=body)
    rate = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]), label="format rate")
    if rate:
        module = module.visit(_Format(_Chooser(draw, rate)))
    if draw(st.integers(0, 4)) == 0:
        module = module.with_changes(default_newline="\r\n")
    text = module.code
    if not _compiles(text):
        # statements of a function body at module level (`return`, `yield`): the whole program in a def
        wrapped = cst.Module(body=[*imports, *nest(statements, "def", 99, indent)], default_newline=module.default_newline)
        text = wrapped.code
    assume(_compiles(text))
    return Program(text=text, origin=tuple(s.name for s in chosen))


def _compiles(text: str) -> bool:
    try:
        compile(text, "<fuzz>", "exec", dont_inherit=True)
        cst.parse_module(text)
    except (SyntaxError, ValueError, cst.ParserSyntaxError, RecursionError):
        return False
    return True


TRAINING = re.compile(r"backward|optim|torch")
# what the text pre-filter looks for besides `torch` (migrate/prefilter.py)
PREFILTER_WORDS = re.compile(r"backward|optim|AdamW|Adafactor|spawn|start_processes")


def without_training_code(text: str, pattern: re.Pattern[str] = TRAINING) -> str | None:
    """`text` without every statement whose code matches `pattern` (None: what is left does not
    compile, or still matches). Compound statements are kept or dropped whole, like simple ones."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return None

    class Strip(cst.CSTTransformer):
        def on_leave(self, original, updated):  # type: ignore[no-untyped-def]
            updated = super().on_leave(original, updated)
            if isinstance(updated, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                if pattern.search(_code(updated)):
                    return cst.RemoveFromParent()
            return updated

        def leave_IndentedBlock(self, original, updated):  # type: ignore[no-untyped-def]
            if not updated.body:
                return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
            return updated

    stripped = module.visit(Strip()).code
    return stripped if _compiles(stripped) and not pattern.search(stripped) else None


# ---- the properties ---------------------------------------------------------------------------


def failures(text: str, path: str = "fuzz_program.py") -> list[str]:
    """Every property `text` breaks (empty: all hold). An exception is caught and reported as one.

    1. no internal error and no exception; a program that compiles is never refused as unparsable;
    2. the output compiles and libcst parses it;
    3. the output passes every safety check of `migrate/safety/registry.py`, called directly on
       (input, output) with the options the output was made with (rules a fallback dropped ignored);
    4. a second run on the output changes nothing;
    5. the program without any statement mentioning backward/optim/torch comes back untouched;
    6. the program without what the text pre-filter looks for, but with a comment that lets it
       through, is parsed and left untouched with no diagnostic (the pre-filter's soundness);
    7. the rules' rewritten tree, which the safety checks read instead of a parse of the output
       (`migrate.safety.fallback.output_tree`), is the tree a parse of its code gives.
    """
    import traceback

    from migrate.engine import Options
    from migrate.runner import migrate_text

    problems: list[str] = []
    try:
        result = migrate_text(text, path, Options())
    except Exception:  # noqa: BLE001 - reported as a failure of property 1
        return ["1: exception\n" + traceback.format_exc()]
    if result.error is not None:
        kind = "internal error" if "internal error" in result.error.message else "error"
        return [f"1: {kind} at {result.error.line}:{result.error.column}: {result.error.message}"]
    if result.new_text is not None:
        problems += _output_failures(text, result.new_text, result, path)
        problems += _tree_failures(text, path)
    problems += _untouched_failures(text, path)
    return problems


def _tree_failures(text: str, path: str) -> list[str]:
    import libcst as cst

    from migrate.engine import Options, run_rules
    from migrate.safety.fallback import output_tree
    from migrate.suppression import skip_lines

    attempt = run_rules(cst.parse_module(text), text, path, Options(), skip_lines(text)[1])
    tree = output_tree(attempt.new_module)
    if tree is None or attempt.new_text is None:
        return []  # parsed from its text by the checks
    where = tree_difference(tree, cst.parse_module(attempt.new_text))
    return [] if where is None else [f"7: the rewritten tree differs from the parse of its code at {where}"]


def tree_difference(tree: object, parsed: object, where: str = "module") -> str | None:
    """Where `tree` differs from `parsed` (None: nowhere), as a path of fields. A field the tree
    leaves to its default (`MaybeSentinel.DEFAULT`: a comma or a star written as code generation
    decides) matches whatever the parser recorded, and a tuple matches a list of the same items."""
    import dataclasses

    import libcst as cst

    if tree is cst.MaybeSentinel.DEFAULT or parsed is cst.MaybeSentinel.DEFAULT:
        return None
    if isinstance(tree, (list, tuple)) and isinstance(parsed, (list, tuple)):
        if len(tree) != len(parsed):
            return f"{where} ({len(tree)} items, parsed {len(parsed)})"
        for i, (a, b) in enumerate(zip(tree, parsed)):
            found = tree_difference(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if type(tree) is not type(parsed):
        return f"{where} ({type(tree).__name__}, parsed {type(parsed).__name__})"
    if isinstance(tree, cst.CSTNode):
        for f in dataclasses.fields(tree):
            found = tree_difference(getattr(tree, f.name), getattr(parsed, f.name), f"{where}.{f.name}")
            if found is not None:
                return found
        return None
    return None if tree == parsed else f"{where} ({tree!r}, parsed {parsed!r})"


def _output_failures(text: str, new_text: str, result, path: str) -> list[str]:  # type: ignore[no-untyped-def]
    import traceback
    from dataclasses import replace

    import migrate.safety.registry as registry
    from migrate.engine import Options
    from migrate.registry import BY_CODE
    from migrate.runner import migrate_text
    from migrate.safety import CheckContext

    if not _compiles(new_text):
        return ["2: the output does not compile or does not parse"]
    problems = []
    dropped = {
        code
        for d in result.diagnostics
        if d.code in registry.BY_CODE
        for code in re.findall(r"AM0\d\d", d.message)
        if code in BY_CODE
    }
    options = replace(Options(), ignore=frozenset(dropped))
    context = CheckContext(
        path=path,
        before=cst.parse_module(text),
        after=cst.parse_module(new_text),
        before_text=text,
        after_text=new_text,
        options=options,
    )
    for check in registry.CHECKS:
        try:
            violations = check.run(context)
        except Exception:  # noqa: BLE001
            problems.append(f"3: {check.code} raised\n" + traceback.format_exc())
            continue
        for violation in violations:
            problems.append(f"3: {check.code} {check.name} at output line {violation.line}: {violation.message}")
    try:
        again = migrate_text(new_text, path, Options())
    except Exception:  # noqa: BLE001
        return problems + ["4: exception on the second run\n" + traceback.format_exc()]
    if again.error is not None:
        problems.append(f"4: the second run failed: {again.error.message}")
    elif again.changed:
        problems.append("4: the second run changed the output: " + ", ".join(f"{c.code}@{c.line}" for c in again.changes))
    return problems


def _untouched_failures(text: str, path: str) -> list[str]:
    import traceback

    from migrate.engine import Options, migrate_source

    problems = []
    for label, pattern, prefix in (("5", TRAINING, ""), ("6", PREFILTER_WORDS, "# torch optim\n")):
        stripped = without_training_code(text, pattern)
        if stripped is None or not stripped.strip():
            continue
        program = prefix + stripped
        try:
            result = migrate_source(program, path, Options())
        except Exception:  # noqa: BLE001
            problems.append(f"{label}: exception\n" + traceback.format_exc())
            continue
        if result.error is not None or result.new_text is not None or (prefix and result.diagnostics):
            what = result.error or [*result.changes, *result.diagnostics]
            problems.append(f"{label}: a program without training code was not left alone: {what}\n{program}")
        if prefix and not result.parsed:
            problems.append(f"{label}: the pre-filter comment did not let the program through")
    return problems
