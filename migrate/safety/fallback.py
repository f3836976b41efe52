"""Check an output before it is written, and fall back to fewer edits when a check fails.

What it does:
    The engine calls `checked` with the first output of the rules (only when a rule changed the
    text: nothing else is ever written). Every check of `migrate/safety/registry.py` reads the
    rewritten tree (`output_tree`: not a second parse of the output), in order, until one fails.
    Then:
    1. the rule to blame is chosen: the rule a violation names (`Violation.rule`, when the check
       knows it), else the rule with a change nearest to the first failing line (the output line is
       mapped back to the input by a line diff; ties: the rule with fewer changes);
    2. when that rule may be left out alone (`DROPPABLE`: the rest still trains correctly on N
       processes without it), the rules run again on the same parsed input with it disabled (as
       `--ignore` would) and the new output is checked again from the first check; checks then see
       the options with the dropped rules ignored, since a second run drops them again;
    3. when the rule is one the rest relies on (creating the Accelerator, prepare, backward, the
       distributed boilerplate...), after `MAX_DROPS` dropped rules, when no rule changed anything
       near, or when the smaller rewrite does not compile, the file is left exactly as it is.
    Each failure becomes one diagnostic, coded by the check (AM101...), at the input line of the
    first failing place: the check's name and message (what would have gone wrong), which rule's
    edits were not written and where, and what to do. Severity "warning", as every diagnostic that
    says "this part was not migrated, do it by hand"; the exit status is that of any diagnostic.

Why:
    A wrong rewrite is worse than none: a script that crashes on one process, or trains differently
    on N, costs its user more than the migration saves. Dropping one rule keeps the rest of the
    migration (prepare, backward, device moves) when a single edit is at fault.

Pure: no I/O; `module` is never changed (libcst trees are immutable), so every run starts from the
same parse. Checks run only on outputs a rule changed, and only the failing files pay for the line
diff and the reruns. `--ignore AM10x` turns one check off (for a check that is wrong on a file).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

import libcst as cst

from migrate.engine import Attempt, Options, run_rules
from migrate.registry import BY_CODE, RULES
from migrate.results import Change, Diagnostic
from migrate.safety import Check, CheckContext, Violation
from migrate.safety import idempotent
from migrate.safety.registry import CHECKS
from migrate.walk import each_node_once

MAX_DROPS = 4  # rules dropped from one file before it is left as it is

# Rules whose edits may be left out alone: the rest of the migration still trains correctly on N
# processes without them (the dropped part is reported, to be done by hand). Any other rule's edits
# are what the rest relies on (create, prepare, backward, distributed boilerplate, mixed precision,
# clipping of scaled gradients, per-rank decisions): without them a migrated script would train
# differently or hang, so the file is left as it is instead.
DROPPABLE: dict[str, str] = {
    "AM002": "a device move left in place moves to the device the object is already on",
    "AM005": "without `accumulate` every step syncs, as with gradient_accumulation_steps=1",
    "AM009": "every process prints and saves (the same file: save from the main process by hand)",
    "AM010": "evaluation then runs on the whole data set in every process, each with the full metric",
}
_ORDER = {rule.code: index for index, rule in enumerate(RULES)}


def checked(
    module: cst.Module, text: str, path: str, options: Options, skipped: set[int], first: Attempt
) -> Attempt:
    """`first` when its output passes every check, else the largest fallback that does (see above)."""
    checks = [check for check in CHECKS if check.code not in options.ignore]
    attempt = first
    dropped: list[str] = []
    failures: list[_Failure] = []
    while checks and attempt.rewrites(text):
        assert attempt.new_text is not None
        # Checks see the options this output was made with: a second run of the tool drops the
        # same rules again for the same reason, so idempotence is judged without them.
        now = replace(options, ignore=options.ignore | set(dropped)) if dropped else options
        failure = first_failure(module, text, path, now, attempt.new_text, checks,
                                after=output_tree(attempt.new_module))
        if failure is None:
            break
        check, violations = failure
        rule = _culprit(violations, attempt, text, attempt.new_text, dropped)
        if rule not in DROPPABLE or len(dropped) == MAX_DROPS:
            failures.append(_Failure(check, violations, attempt, None, blamed=rule))
            return _unchanged(first, failures, text)
        failures.append(_Failure(check, violations, attempt, rule))
        dropped.append(rule)
        attempt = run_rules(module, text, path, replace(options, ignore=options.ignore | set(dropped)), skipped)
        if attempt.error is not None:
            return _unchanged(first, failures, text)
    if failures:
        kept = [d for d in first.diagnostics if d.code in dropped]  # still true of the input
        notes = [_note(f, text, kept_rest=True) for f in failures]
        attempt.diagnostics = _sorted([*attempt.diagnostics, *kept, *notes])
    return attempt


@dataclass
class _Failure:
    check: Check
    violations: list[Violation]
    attempt: Attempt  # the output that failed
    rule: str | None  # the rule dropped for it (None: the file is left as it is)
    blamed: str | None = None  # with rule None: the rule at fault that the others need


def output_tree(rewritten: cst.Module | None) -> cst.Module | None:
    """The tree the checks read for an output: the rewritten tree itself, which is what a parse of
    its code would give (tests/migrate/test_output_tree.py checks that on every fixture and in the
    property tests), so the output is not parsed a second time (a parse is most of what a file
    costs). Not when a rule put one node object in two places: analyses keyed by node would take
    them for one, so such an output (and one without a tree) is parsed (None)."""
    if rewritten is None or not each_node_once(rewritten):
        return None
    return rewritten


def first_failure(
    module: cst.Module, text: str, path: str, options: Options, new_text: str, checks: list[Check],
    after: cst.Module | None = None,
) -> tuple[Check, list[Violation]] | None:
    """The first check `new_text` fails, with its violations (sorted by line), or None. `after`:
    `new_text` already parsed, when the caller has it."""
    try:
        if after is None:
            after = cst.parse_module(new_text)
    except cst.ParserSyntaxError as error:  # compiled, but not in libcst's grammar: never write it
        reason = str(error.message).splitlines()[0]
        return _PARSES, [Violation(error.raw_line, f"a second run could not parse the output ({reason})")]
    context = CheckContext(path=path, before=module, after=after, before_text=text, after_text=new_text,
                           options=options)
    for check in checks:
        violations = check.run(context)
        if violations:
            return check, sorted(violations, key=lambda v: v.line)
    return None


# An output Python compiles but libcst cannot parse: a second run would fail (idempotence).
_PARSES = Check(code=idempotent.CODE, name=idempotent.NAME, run=idempotent.check, doc=idempotent.__doc__ or "")


def map_line(before: str, after: str, line: int) -> int:
    """The input line an output line comes from (inserted lines: the input line they precede)."""
    old, new = before.splitlines(), after.splitlines()
    index = max(line - 1, 0)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if j1 <= index < j2:
            if tag == "equal":
                return i1 + (index - j1) + 1
            if tag == "replace" and i2 - i1 <= 400:  # a rewritten block (re-indented, say): the likest line
                wanted = new[index].strip()
                return max(range(i1, i2), key=lambda i: (difflib.SequenceMatcher(None, old[i].strip(), wanted).ratio(), -i)) + 1
            return min(i1 + (index - j1), max(i2 - 1, i1), max(len(old) - 1, 0)) + 1
    return max(min(line, len(old)), 1)


def _culprit(violations: list[Violation], attempt: Attempt, text: str, new_text: str, dropped: list[str]) -> str | None:
    by_rule: dict[str, list[Change]] = {}
    for change in attempt.changes:
        if change.code in BY_CODE and change.code not in dropped:
            by_rule.setdefault(change.code, []).append(change)
    if not by_rule:
        return None
    for violation in violations:
        if violation.rule in by_rule:
            return violation.rule
    line = map_line(text, new_text, violations[0].line)
    return min(
        by_rule,
        key=lambda code: (min(abs(c.line - line) for c in by_rule[code]), len(by_rule[code]), _ORDER[code]),
    )


def _note(failure: _Failure, text: str, kept_rest: bool) -> Diagnostic:
    check, violations, attempt, rule = failure.check, failure.violations, failure.attempt, failure.rule
    assert attempt.new_text is not None
    line = map_line(text, attempt.new_text, violations[0].line)
    message = f"{check.name}: {violations[0].message}"
    same = {map_line(text, attempt.new_text, v.line) for v in violations[1:] if v.message == violations[0].message}
    other = {map_line(text, attempt.new_text, v.line) for v in violations[1:] if v.message != violations[0].message}
    for lines, label in ((same - {line}, "also at"), (other - {line}, "other such problems at")):
        if lines:
            shown = sorted(lines)
            message += f" ({label} line{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown[:8]))}"
            message += ", ...)" if len(shown) > 8 else ")"
    blamed = rule or failure.blamed
    if blamed in BY_CODE:
        lines = sorted({c.line for c in attempt.changes if c.code == blamed})
        where = ", ".join(map(str, lines[:8])) + (", ..." if len(lines) > 8 else "")
        edits = f"the {blamed} ({BY_CODE[blamed].name}) edits (line{'s' if len(lines) > 1 else ''} {where})"
        if kept_rest:
            message += (
                f"; so {edits} were not written and the rest of the migration was kept: do that part by hand "
                f"(without it {DROPPABLE[blamed]})"
            )
        elif rule is None:
            message += f"; {edits} look at fault, and the rest of the migration relies on them"
        else:
            message += f"; {edits} were left out for this, but the smaller rewrite failed a check too"
    if not kept_rest:
        message += "; so the file was left as it is: migrate it by hand"
    # the rule's edits were left out (or the whole file): training code it would have converted stays as it was
    return Diagnostic(check.code, line, message + f" (`accel-migrate explain {check.code}`)", unconverted=True)


def _unchanged(first: Attempt, failures: list[_Failure], text: str) -> Attempt:
    """Nothing is written: the first run's diagnostics still describe the input, plus one note per
    failure."""
    notes = [_note(f, text, kept_rest=False) for f in failures]
    return Attempt(changes=[], diagnostics=_sorted([*first.diagnostics, *notes]), new_text=None)


def _sorted(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(dict.fromkeys(diagnostics), key=lambda d: (d.line, d.code, d.message))
