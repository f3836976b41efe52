"""`# accel-migrate: skip` comments: on a line, or in the file's header comments for the whole file.

A skip in the header (comments and blank lines before the first statement) leaves the file as it
is. On a line, every rewrite and diagnostic of a node starting on that line is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import libcst as cst

from migrate.edits import EditPlan

_SKIP = re.compile(r"#\s*accel-migrate:\s*skip\b")


def skip_lines(text: str) -> tuple[bool, set[int]]:
    """(whole file skipped, line numbers carrying a skip comment)."""
    if "accel-migrate:" not in text:
        return False, set()
    whole = False
    lines: set[int] = set()
    in_header = True
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        marked = _SKIP.search(line) is not None
        if in_header and (not stripped or stripped.startswith("#")):
            whole = whole or marked
            continue
        in_header = False
        if marked:
            lines.add(number)
    return whole, lines


def drop_skipped(plan: EditPlan, line_of: Callable[[cst.CSTNode], int], lines: set[int]) -> None:
    """Remove from the plan every edit, change and finding whose node starts on a skipped line."""

    def keep(node: cst.CSTNode) -> bool:
        return line_of(node) not in lines

    for edits in (
        plan.calls, plan.replace_stmt, plan.insert_before, plan.insert_after, plan.new_params, plan.new_args,
        plan.wrap_loop_body, plan.attributes, plan.subscripts, plan.comparisons, plan.if_tests,
    ):
        for node in [n for n in edits if not keep(n)]:
            del edits[node]  # type: ignore[attr-defined]
    for group in (plan.drop_if_trivial, plan.keep_left_operand, plan.remove_small):
        group.difference_update({n for n in group if not keep(n)})
    plan.changes[:] = [r for r in plan.changes if keep(r.node)]
    plan.findings[:] = [f for f in plan.findings if keep(f.node)]
