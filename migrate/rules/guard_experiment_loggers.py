"""Create and write experiment logs (TensorBoard, wandb, mlflow, `logging`) on the main process only.

What it does:
    In a training script it migrates, wraps each statement that creates or writes an experiment
    log in `if accelerator.is_main_process:` (neighbouring statements share one `if`):
    - `writer = SummaryWriter(...)` (`torch.utils.tensorboard`, `tensorboardX`) and every
      `writer.add_scalar(...)` / `writer.flush()` / `writer.close()` statement on that writer;
    - `wandb.init(...)`, `wandb.log(...)`, `wandb.finish()` (and `run = wandb.init(...)` with
      `run.log(...)`), `mlflow.start_run()`, `mlflow.log_metric(...)`, `mlflow.log_params(...)`;
    - `logging.basicConfig(...)`. The logger calls themselves stay as they are: on the other
      processes the root logger keeps Python's defaults, so `logger.info(...)` lines are written
      once, and warnings and errors of every process still reach stderr (a warning from rank 3 is
      worth seeing; guarding every `logger.warning` would hide it). The runtime has no
      `get_logger(main_process_only=...)` helper to call instead.

Why:
    Every process runs the script. Without this, N processes each create an event file in the same
    TensorBoard directory (curves drawn N times, each from 1/N of the data), start N wandb or
    mlflow runs, and write every log line N times, interleaved, into the same file.

Example:
    writer = SummaryWriter("runs/exp")          if accelerator.is_main_process:
    ...                                     ->      writer = SummaryWriter("runs/exp")
    writer.add_scalar("loss", loss, step)       ...
                                                if accelerator.is_main_process:
                                                    writer.add_scalar("loss", loss, step)

Leaves alone:
    Statements already under a main-process or rank check (`if accelerator.is_main_process:`,
    `if rank == 0:`), files it does not otherwise migrate, and `logging` set up through handlers
    (`logger.addHandler(...)`). Reported, with the line and the fix, rather than guarded: a writer
    or run that is also used other than as the receiver of a logging statement (passed to a
    helper, stored, used in an expression or a `with`: on the other processes it would not
    exist), one kept as an attribute (`self.writer = SummaryWriter()`), a logging call that is part
    of an expression, and logging in a function that cannot reach the accelerator. When one wandb
    (or mlflow) call cannot be guarded, none of that library's calls in the file is: `wandb.log`
    on a process where `wandb.init` did not run raises.

Fix safety:
    On one process the main process is the only process: nothing changes. On N processes the
    guarded statements run on the main process only; every other use of the writer or run was
    checked to be guarded too, so no process reads a name it did not bind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from migrate.analysis import Scope, StmtRef
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.walk import walk

CODE = "AM012"
NAME = "guard-experiment-loggers"

# Calls that create a log object the script then writes through.
_WRITERS = frozenset({
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "wandb.init",
    "mlflow.start_run",
})
_LOG_MODULES = ("wandb.", "mlflow.")
_LOGGING_SETUP = frozenset({"logging.basicConfig"})
# An enclosing `if` that already restricts to one process (ours, or the script's own rank check).
_RANK_TEST = re.compile(r"main_process|rank|primary|master|is_main", re.IGNORECASE)


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.refused or roles.accelerator_scope is None:
        return
    found = [_Found(scope) for scope in roles.facts.scopes if not isinstance(scope.node, cst.ClassDef)]
    for item in found:
        _collect(item)
    # `wandb.log` on a process without `wandb.init` raises: a family (wandb, mlflow) with a call that
    # cannot be guarded anywhere in the file stays on every process, everywhere.
    broken = {family for item in found for family, _, _ in item.problems if family}
    for item in found:
        if (item.guarded or item.problems) and not roles.can_reach(item.scope):
            broken.update(family for family, _ in item.guarded if family)  # logs on every process there
    for item in found:
        scope = item.scope
        if not item.guarded and not item.problems:
            continue
        if not roles.can_reach(scope):
            first = item.guarded[0][1] if item.guarded else item.problems[0][1]
            plan.report(
                CODE, first,
                f"experiment logging in `{scope.name}`, which cannot reach the accelerator, runs on every "
                "process (N event files, runs or copies of each line): run it on the main process only "
                "(`if accelerator.is_main_process:`, passing `accelerator` in)",
            )
            continue
        for _, node, message in item.problems:
            plan.report(CODE, node, message)
        guarded = [stmt for family, stmt in item.guarded if family not in broken]
        for stmt in guarded:
            if stmt not in plan.main_process_only:
                plan.main_process_only.add(stmt)
                plan.change(CODE, stmt, "experiment logging on the main process only")
        if guarded:
            plan.use_accelerator(scope)


@dataclass(eq=False)
class _Found:
    scope: Scope
    guarded: list[tuple[str, cst.BaseStatement]] = field(default_factory=list)  # (family, statement)
    problems: list[tuple[str, cst.CSTNode, str]] = field(default_factory=list)  # (family, node, message)


def _family(qualified: str) -> str:
    """Calls that must all be guarded or none: a module API with its own global run state."""
    head = qualified.split(".", 1)[0]
    return head if head in ("wandb", "mlflow") else ""


def _collect(item: _Found) -> None:
    scope = item.scope
    writers: dict[str, str] = {}  # name -> the call that created it
    logging_stmts: set[int] = set()
    calls = [c for c in scope.library_calls if _is_logging(c.qualified)]
    for call in calls:
        kind = _statement_kind(call.where.stmt, call.call)
        if kind == "expression" or (kind is not None and call.qualified in _WRITERS):
            logging_stmts.add(id(call.where.stmt))
            if kind != "expression":
                writers.setdefault(kind, call.qualified)
            if not _already_guarded(call.where):
                item.guarded.append((_family(call.qualified), call.where.stmt))
    for call in calls:
        if id(call.where.stmt) in logging_stmts:
            continue  # `wandb.log({"img": wandb.Image(x)})`: inside a guarded statement
        # Part of an expression, a `with`, or `x = wandb.Image(...)`: not a statement to guard.
        item.problems.append((_family(call.qualified), call.call, _unguardable_call(call.qualified, call.where.stmt)))
    for name, created_by in writers.items():
        sites, bad = _writer_uses(scope, name)
        family = _family(created_by)
        if bad is not None:
            item.problems.append((family, bad, _unguardable_writer(name, created_by)))
            # Its creation stays on every process: so does every statement writing through it.
            creations = {id(b.where.stmt) for b in scope.bindings.get(name, [])}
            item.guarded = [(f, s) for f, s in item.guarded if id(s) not in creations]
            continue
        item.guarded.extend((family, s.stmt) for s in sites if not _already_guarded(s))


def _is_logging(qualified: str) -> bool:
    return qualified in _WRITERS or qualified.startswith(_LOG_MODULES) or qualified in _LOGGING_SETUP


def _statement_kind(stmt: cst.BaseStatement, call: cst.Call) -> str | None:
    """"expression" for `call(...)` as a whole one-statement line, the target name for
    `name = call(...)`, None otherwise (part of an expression, a `with`, a return...)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and small.value is call:
        return "expression"
    if (
        isinstance(small, cst.Assign)
        and small.value is call
        and len(small.targets) == 1
        and isinstance(small.targets[0].target, cst.Name)
    ):
        return small.targets[0].target.value
    return None


def _already_guarded(where: StmtRef) -> bool:
    empty = cst.Module([])
    for outer in where.path:
        stmt = outer.stmt
        if isinstance(stmt, (cst.If, cst.While)) and _RANK_TEST.search(empty.code_for_node(stmt.test)):
            return True
    return False


def _writer_uses(scope: Scope, name: str) -> tuple[list[StmtRef], cst.CSTNode | None]:
    """The statements `name.method(...)` of `scope`, and the first other read of `name` (None:
    every read is such a statement). A rebinding other than by the creating call counts too."""
    receivers: dict[int, StmtRef] = {}
    for site in scope.method_calls:
        if isinstance(site.receiver, cst.Name) and site.receiver.value == name and _statement_kind(
            site.where.stmt, site.call
        ) == "expression":
            receivers[id(site.receiver)] = site.where
    for binding in scope.bindings.get(name, []):
        value = binding.value
        if not isinstance(value, cst.Call) or _statement_kind(binding.where.stmt, value) != name:
            return [], binding.where.stmt
    reads = _ReadsOf(name)
    walk(scope.node, reads)
    for node in reads.found:
        if id(node) not in receivers:
            return [], node
    return list(receivers.values()), None


class _ReadsOf(cst.CSTVisitor):
    """Every `Name` node spelling `name` that reads it (not attribute names, keywords, targets)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == self.name:
            self.found.append(node)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        walk(node.value, self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)
        return False

    def visit_Assign(self, node: cst.Assign) -> bool:
        for target in node.targets:
            if not (isinstance(target.target, cst.Name) and target.target.value == self.name):
                walk(target.target, self)
        walk(node.value, self)
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        walk(node.body, self)  # a helper reading it from outside: a use the guard cannot follow
        return False


def _unguardable_call(qualified: str, stmt: cst.BaseStatement) -> str:
    if isinstance(stmt, cst.With):
        where = "a `with` statement"
    elif isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Assign, cst.AnnAssign)) for s in stmt.body):
        where = "an assignment"
    else:
        where = "an expression"
    family = _family(qualified)
    left = (
        f"so every `{family}` call of this file stays on every process (N runs: a call on a process where "
        f"the run was not started raises or starts a run of its own)"
        if family else "so it runs on every process (N copies)"
    )
    return (
        f"`{qualified}(...)` is part of {where} here, which cannot simply run on the main process only, "
        f"{left}: run it and what uses its result under `if accelerator.is_main_process:`"
    )


def _unguardable_writer(name: str, created_by: str) -> str:
    short = created_by.rsplit(".", 1)[-1] if created_by.endswith("SummaryWriter") else created_by
    return (
        f"`{name}` (from `{short}(...)`) is used here other than by a logging statement (passed on, stored "
        f"or in an expression), so its logging stays on every process (N event files or runs): create it "
        f"with `{name} = {short}(...) if accelerator.is_main_process else None` and write through it under "
        f"`if {name} is not None:`"
    )
