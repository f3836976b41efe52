"""Migrate one file's text: a pure function of text and options, with no I/O.

Pipeline: text pre-filter (`prefilter.py`: no training code, so untouched and not parsed) -> one
parse -> statement start lines (`positions.py`) -> one analysis pass -> roles -> each selected rule
records edits -> one rewrite pass, descending only towards edited nodes -> unused names removed ->
imports added -> the output must compile, or the file is reported as failed and left untouched ->
safety checks on the output (`migrate/safety/`: the rewritten tree, not parsed again, every check of
`migrate/safety/registry.py`, only when a rule changed the text): an output that fails one is not
returned; the rules run again without the rule at fault, or the file is left as it is, and a
diagnostic coded by the check says what was dropped (`migrate/safety/fallback.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import libcst as cst

from migrate import already_distributed
from migrate.analysis import Facts, analyze
from migrate.cleanup import remove_unused
from migrate.edits import EditPlan
from migrate.imports import add_imports
from migrate.positions import start_lines
from migrate.registry import RULES
from migrate.results import Change, Diagnostic, FileError, FileResult
from migrate.rewriter import Rewriter, annotate
from migrate.roles import Roles, find_roles, hand_update, hidden_step
from migrate.rules import remove_distributed_boilerplate
from migrate.statement_code import StatementCode
from migrate.suppression import drop_skipped, skip_lines
from migrate.walk import with_ancestors

TARGETS = ("runtime", "accelerate")


@dataclass(frozen=True)
class Options:
    target: str = "runtime"
    select: frozenset[str] = frozenset()  # empty: every rule
    ignore: frozenset[str] = frozenset()
    mixed_precision: str = "no"  # Accelerator(mixed_precision=...) when the script has no AMP code
    strategy: str | None = None  # Accelerator(strategy=...) unless the script shards by hand (AM007)
    annotate: bool = False  # leave `# TODO(accel-migrate): ...` above each diagnostic's statement

    def enabled(self, code: str) -> bool:
        return (not self.select or code in self.select) and code not in self.ignore


def mentions_torch(text: str) -> bool:
    """The text pre-filter: False when no rule could change or report anything in `text`, which is
    then left untouched without being parsed (nor checked for syntax errors).

    True only for text that mentions `torch` and holds one of: the word `optim` (a `torch.optim`
    optimizer), a `.backward(` call, `transformers` with `AdamW`/`Adafactor`, or `multiprocessing`
    with `spawn`/`start_processes`. It over-approximates what the engine acts on; the full argument
    is in `migrate/prefilter.py`, and a test checks it on every fixture and a sample of torch's sources.
    """
    from migrate.prefilter import worth_parsing

    return worth_parsing(text)


def migrate_source(
    text: str, path: str = "<string>", options: Options = Options(), module: cst.Module | None = None,
    facts: Facts | None = None,
) -> FileResult:
    """One file's text -> FileResult. `module`: `text` already parsed, when the caller has it;
    `facts`: its analysis (`analyze(module, text)`, not `stepped`), when the caller has that too."""
    result = FileResult(path=path, old_text=text)
    if not mentions_torch(text):
        return result
    try:
        if module is None:
            module = cst.parse_module(text)
    except cst.ParserSyntaxError as error:
        result.error = _syntax_error(text, path, error)
        return result
    skip_file, skipped = skip_lines(text)
    if skip_file:
        return result  # `# accel-migrate: skip` in the header: left as it is, reported as skipped
    result.parsed = True

    attempt = run_rules(module, text, path, options, skipped, facts=facts)
    if attempt.error is None and attempt.rewrites(text):
        from migrate.safety.fallback import checked

        attempt = checked(module, text, path, options, skipped, attempt)
    result.changes = attempt.changes
    result.diagnostics = attempt.diagnostics
    result.error = attempt.error
    if attempt.error is None and attempt.new_text is not None and attempt.new_text != text:
        result.new_text = attempt.new_text
    return result


@dataclass
class Attempt:
    """What one run of the rules over a parsed module produced (nothing written, nothing checked)."""

    changes: list[Change] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    new_text: str | None = None  # None: no edit planned
    new_module: cst.Module | None = None  # the rewritten tree (`new_text` is its code)
    error: FileError | None = None

    def rewrites(self, text: str) -> bool:
        """A rule changed the text (the runner writes only such outputs, so only they are checked)."""
        return bool(self.changes) and self.new_text is not None and self.new_text != text


def run_rules(
    module: cst.Module, text: str, path: str, options: Options, skipped: set[int], report: bool = True,
    facts: Facts | None = None,
) -> Attempt:
    """The rules over one parsed module: analysis, roles, edits, one rewrite, cleanup, imports; the
    output must compile. A pure function of its arguments: `module` is not changed, so the safety
    fallback (`migrate/fallback.py`) and the idempotence check run it again on the same tree.

    With `report=False` only the output is wanted (the idempotence check): changes and diagnostics
    are not located, unless skip comments need the lines. `facts`: `analyze(module, text)` when the
    caller made it already (a unit's module); marked `stepped` when the roles changed it.
    """
    attempt = Attempt()
    roles = find_roles(analyze(module, text) if facts is None else facts)
    if roles.hidden_steps:
        roles.facts.stepped = True
    plan = plan_edits(roles, options)

    counts: dict[int, int] = {}  # line counts of statements, shared by the passes below
    if (plan.changes or plan.findings) and (report or skipped):
        # Skip comments and annotations look up other nodes' lines; otherwise only the reported ones.
        line = start_lines(module, None if skipped or options.annotate else
                           [*(r.node for r in plan.changes), *(f.node for f in plan.findings)], counts)
        if skipped:
            drop_skipped(plan, line.__getitem__, skipped)
        if options.annotate:
            annotate(module, plan, line.__getitem__)
        attempt.changes = sorted(
            {Change(r.code, line[r.node], r.message) for r in plan.changes},
            key=lambda c: (c.line, c.code, c.message),
        )
        attempt.diagnostics = sorted(
            {Diagnostic(f.code, line[f.node], f.message, unconverted=f.unconverted) for f in plan.findings},
            key=lambda d: (d.line, d.code, d.message),
        )
    elif plan.changes:
        attempt.changes = [Change(r.code, 0, r.message) for r in plan.changes]
    if plan.empty:
        if report:
            _say_already_distributed(attempt, roles, path)
        return attempt

    rewriter = Rewriter(plan, with_ancestors(module, plan.targets()))
    new_module = module.visit(rewriter)
    if plan.removes_boilerplate or rewriter.rebound:
        new_module = remove_unused(module, new_module, rewriter.rebound)
    if plan.imports:
        new_module = add_imports(new_module, plan.imports)
    new_text = StatementCode(module, text, counts)(new_module)
    try:
        compile(new_text, path, "exec", dont_inherit=True)
    except SyntaxError as error:
        attempt.error = FileError(
            error.lineno or 0,
            error.offset or 0,
            f"internal error: the rewrite produced invalid Python ({error.msg}); the file was left "
            "untouched, please report this with the file",
        )
        return attempt
    attempt.new_text = new_text
    attempt.new_module = new_module
    return attempt


def _say_already_distributed(attempt: Attempt, roles: Roles, path: str) -> None:
    """A refused script that already trains distributed as it is: its first refusal says so and how
    it is started (`migrate.already_distributed`)."""
    first = next((d for d in attempt.diagnostics if d.unconverted), None)
    if first is None:
        return
    said = already_distributed.note([roles.facts], path)
    if said is not None:
        attempt.diagnostics = [replace(d, message=f"{d.message}. {said}") if d is first else d for d in attempt.diagnostics]


def plan_edits(roles: Roles, options: Options) -> EditPlan:
    """The selected rules' edits and findings over resolved roles (of one module, or of the joined
    view of a unit's modules: `migrate/crossmodule/`)."""
    plan = EditPlan(target=options.target)
    hidden_step.refuse_for_options(roles, options.mixed_precision, options.strategy)
    hand_update.refuse_for_options(roles, options.mixed_precision, options.strategy)
    if options.mixed_precision != "no":
        plan.accelerator_kwargs["mixed_precision"] = f'"{options.mixed_precision}"'
    if options.strategy is not None:
        plan.accelerator_kwargs["strategy"] = f'"{options.strategy}"'
    plan.findings.extend(f for f in roles.findings if options.enabled(f.code)
                         and (f.targets is None or options.target in f.targets))
    if not options.enabled(remove_distributed_boilerplate.CODE):
        # prepare binds a hand-wrapped model alias only when AM007 removes the alias's own
        # bindings, which would otherwise overwrite the prepared model
        roles.model_aliases.clear()
    for rule in RULES if not roles.refused else ():
        if options.enabled(rule.code):
            rule.apply(roles, plan)
    return plan


def _syntax_error(text: str, path: str, error: cst.ParserSyntaxError) -> FileError:
    """Python's own message and position when it has one: they are more precise than libcst's."""
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as python_error:
        line, column, message = python_error.lineno or 0, python_error.offset or 0, python_error.msg
    else:  # valid for this interpreter but not for libcst's grammar
        line, column, message = error.raw_line, error.raw_column + 1, str(error.message).splitlines()[0]
    return FileError(line, column, f"cannot parse: {message}; fix it and run again (the file was left untouched)")
