"""Running the whole pipeline again on the output changes nothing (AM103, idempotent).

What it checks:
    The rules run again, with the same options, on the output (the rewritten tree all checks
    read, so no second parse): no rule may record a change whose rewrite alters the
    text. Cheap on purpose: an output the text pre-filter rejects, or whose header says
    `# accel-migrate: skip`, passes without analysis; a second run that records no change passes
    without a rewrite; only one that records changes is rewritten and compared. An output that
    Python compiles but libcst cannot parse fails too (a second run could not read it).

Why:
    Users run the tool again: on a repository migrated in steps, in pre-commit hooks, in CI with
    `--check`. A rewrite that is not a fixed point rewrites its own output (a
    `load_state_dict` before `prepare` wrapped in `unwrap_model` on the second run, an
    `accelerator.backward` replaced again), and usually means the first run misread the script,
    so the first output is not trusted either.

What it cannot see:
    Nothing outside this file; diagnostics of the second run are not compared (a second run may
    say more about what it leaves alone).

Example:
    A state dict loaded before the script's own `accelerator.prepare(...)` was rewritten to
    `accelerator.unwrap_model(net).load_state_dict(...)` by a second run: reported here, at the
    line that would change, naming the rule (AM009) whose edits are then not written.
"""

from __future__ import annotations

import difflib

from migrate.safety import CheckContext, Violation

CODE = "AM103"
NAME = "idempotent"


def check(context: CheckContext) -> list[Violation]:
    from migrate.engine import mentions_torch, run_rules
    from migrate.suppression import skip_lines

    text = context.after_text
    if not mentions_torch(text):
        return []
    skip_file, skipped = skip_lines(text)
    if skip_file:
        return []
    again = run_rules(context.after, text, context.path, context.options, skipped, report=False)  # type: ignore[arg-type]
    if again.error is not None:
        return [Violation(again.error.line, f"a second run would fail: {again.error.message}")]
    if not again.rewrites(text):
        return []
    assert again.new_text is not None
    line, old, new = _first_difference(text, again.new_text)
    rules = sorted({change.code for change in again.changes})
    what = next(change.message for change in again.changes)
    shown = f"`{old.strip()}` would become `{new.strip()}`" if old.strip() and new.strip() else "this line would change"
    return [Violation(line, (
        f"a second run would rewrite the output again ({', '.join(rules)}: {what}): {shown}; a rewrite that "
        "does not stay as it is misread the script"
    ), rule=rules[0] if len(rules) == 1 else None)]


def _first_difference(old: str, new: str) -> tuple[int, str, str]:
    """(1-based line in `old`, old line, new line) of the first change from `old` to `new`."""
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            return i1 + 1, a[i1] if i1 < i2 else "", b[j1] if j1 < j2 else ""
    return 1, "", ""
