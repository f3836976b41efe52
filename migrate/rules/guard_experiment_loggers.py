"""Convert experiment logging to the tracker API, or run it on the main process only.

What it does:
    In a training script it migrates (and that has no Accelerator yet), one kind of logging is
    converted to the tracker API when the result is provably the same log:
    - a `SummaryWriter` whose directory is a string literal, written to with `add_scalar(tag,
      value[, step])` / `flush()` / `close()` only: `Accelerator(log_with="tensorboard",
      project_dir=<parent>)`, `accelerator.init_trackers(<last part>)` (the tracker writes to
      `<project_dir>/<project_name>`: the same directory), `accelerator.log({tag: value},
      step=step)`, `flush()` removed (the tracker flushes after every log) and `close()` ->
      `accelerator.get_tracker("tensorboard").finish()`. Its other options (`flush_secs=`, ...)
      go to `init_kwargs={"tensorboard": {...}}`;
    - otherwise `wandb.init(project=..., config=..., **options)` + `wandb.log(values[, step=])` +
      `wandb.finish()`: `Accelerator(log_with="wandb")`, `accelerator.init_trackers(project,
      config=..., init_kwargs={"wandb": options})`, `accelerator.log(...)`,
      `accelerator.get_tracker("wandb").finish()`.
    The tracker API writes on the main process only, so these lines need no guard. Everything
    else it wraps in `if accelerator.is_main_process:` (neighbouring statements share one `if`):
    - `writer = SummaryWriter(...)` (`torch.utils.tensorboard`, `tensorboardX`) and every
      `writer.add_scalar(...)` / `writer.flush()` / `writer.close()` statement on that writer;
      the same for `self.writer = SummaryWriter(...)` in a method and `self.writer.<method>(...)`
      statements in the methods of that class, when those are its only uses in the file (a read in
      a statement that runs on the main process only anyway, `save_config_file(self.writer.log_dir,
      cfg)` under checkpoints-and-output's guard or `logging.basicConfig(filename=...)` under this
      rule's, is no other use; nor is a `logging` line reading it, `logging.info(f"saved in
      {self.writer.log_dir}")`, which then runs on the main process only too);
    - the same for an object of a logger class of the project that the migration cannot read
      (imported from a module it does not have, also inside a method: `from logger import Logger;
      self.logger = Logger(self.log_dir)` and `self.logger.scalar_summary(tag, value, step)`), known
      by its name alone: a CamelCase name ending in `Logger` or `Writer` (`Logger`, `TBLogger`,
      `ExperimentLogger`), handed a folder or a path (an argument naming a dir, path, folder, root,
      runs or log, or a literal path; not `MetricLogger(delimiter="  ")`), where the accelerator
      reaches (elsewhere it is left alone); such a class usually opens an event file or a run when
      built, so it is built on the main process only, with its writes;
    - `wandb.init(...)`, `wandb.log(...)`, `wandb.finish()` (and `run = wandb.init(...)` with
      `run.log(...)` and the methods of its members, `run.config.update(...)`),
      `mlflow.start_run()`, `mlflow.log_metric(...)`, `mlflow.log_params(...)`. wandb's media and
      data types (`wandb.Image(x)`, `wandb.Histogram(t)`, `wandb.Table(...)`, `wandb.plot.*`) are
      values to log, built in memory with no run: they stay where they are, on every process, and
      only the statement that logs them is guarded;
    - `logging.basicConfig(...)`. The logger calls themselves stay as they are: on the other
      processes the root logger keeps Python's defaults, so `logger.info(...)` lines are written
      once, and warnings and errors of every process still reach stderr (a warning from rank 3 is
      worth seeing; guarding every `logger.warning` would hide it). The runtime has no
      `get_logger(main_process_only=...)` helper to call instead.
      Not where the program already chooses per process what its loggers print: a level set from
      the process (`logger.setLevel(logging.INFO if accelerator.is_local_main_process else
      logging.ERROR)`, `set_verbosity_error()` in the `else` of a rank check) or HF Accelerate's
      `get_logger`, whose lines print on the main process only unless a call says
      `main_process_only=False`. That console setup is meant for every process (guarding it
      would drop those lines on the others, a second guard over the script's own); a
      `basicConfig(filename=...)` is still guarded.

Why:
    Every process runs the script. Without this, N processes each create an event file in the same
    TensorBoard directory (curves drawn N times, each from 1/N of the data), start N wandb or
    mlflow runs, and write every log line N times, interleaved, into the same file. The tracker
    API says the same without an `if` around every line, as HF Accelerate users write it.

Example:
    writer = SummaryWriter("runs/exp")          accelerator = Accelerator(log_with="tensorboard", project_dir="runs")
    ...                                     ->  accelerator.init_trackers("exp")
    writer.add_scalar("loss", loss, step)       ...
                                                accelerator.log({"loss": loss}, step=step)

    writer = SummaryWriter(args.log_dir)        if accelerator.is_main_process:
    ...                                     ->      writer = SummaryWriter(args.log_dir)
    writer.add_histogram("w", w, step)          ...
                                                if accelerator.is_main_process:
                                                    writer.add_histogram("w", w, step)

Leaves alone:
    Statements already under a main-process or rank check (`if accelerator.is_main_process:`,
    `if rank == 0:`), files it does not otherwise migrate, and `logging` set up through handlers
    (`logger.addHandler(...)`). A class whose every mention, in every module the script reaches,
    builds an instance in the body of a main-process check (`if global_rank == 0 and
    args.log_dir: log_writer = utils.TensorboardLogger(...) else: log_writer = None`, or the
    `else` of `if rank != 0:`): its methods run on the main process only, so the logging in them
    (a SummaryWriter made in `__init__`, written in `update`) is neither guarded nor reported; a
    subclass, the class passed on, or an instance built anywhere else keeps them in. A writer the
    script itself builds on the main process only, every binding of its name either that call in
    such a branch or `None` (`if global_rank == 0: log_writer = SummaryWriter(...) else: log_writer
    = None`), is the script's own business wherever it is passed (`if log_writer is not None:`):
    neither guarded nor reported. Not converted, guarded instead: a writer whose directory is
    computed (`SummaryWriter(args.log_dir)`: which project_dir and run name it splits into is
    not known before it runs) or missing (`SummaryWriter()` picks a dated directory), created in
    a loop or only on some runs (under an `if`, other than `if __name__ == "__main__":`, or a
    `try`: `if args.track: import wandb; wandb.init(...)` imports wandb only when asked for, and
    `log_with=` would make every run start the tracker, failing where the package is not
    installed), one of two writers, or written with anything but `add_scalar` (`add_histogram`,
    `add_image`: the tracker logs numbers and text); wandb with any other call (`wandb.watch`,
    `wandb.Image`), `run = wandb.init(...)`, `init` without `project=`, or `log` with
    `commit=`; both kinds at once (only the SummaryWriter is converted: `accelerator.log` would
    send every value to both). Reported, with the line and the fix, rather than guarded: a writer
    or run that is also used other than as the receiver of a logging statement (passed to a
    helper, stored, used in an expression or a `with`: on the other processes it would not
    exist; for `self.writer`, also a read outside its class's methods), a logging call that is part
    of an expression, and logging in a function that cannot reach the accelerator (also a method of
    a class that never holds it: an nn.Module, or a class of a script that creates the Accelerator
    at module level) (the fix for a
    writer passed on: `writer = SummaryWriter(...) if accelerator.is_main_process else None`, and
    write through it under `if writer is not None:`). When one wandb
    (or mlflow) call cannot be guarded, none of that library's calls in the file is: `wandb.log`
    on a process where `wandb.init` did not run raises. One exception: where no Accelerator is in
    scope (at module level, above training code in functions; or a plain function of the script that
    runs before or without the one that creates it), a scope whose only logging is
    `logging.basicConfig(...)` (to the console, or `filename=` / `handlers=`) runs it under
    `if int(os.environ.get("RANK", "0")) == 0:`, the launcher's rank that
    `accelerator.is_main_process` is made from (torchrun, `accel launch` and `accelerate launch` set
    RANK; plain `python` is rank 0), as prints and file writes there do (checkpoints-and-output):
    the other processes keep Python's logging defaults, as under `if accelerator.is_main_process:`.

Fix safety:
    On one process the main process is the only process: nothing changes. On N processes the
    guarded statements run on the main process only; every other use of the writer or run was
    checked to be guarded too, so no process reads a name it did not bind. A converted writer
    writes the same scalars at the same steps into the same directory (tensors are logged as
    their number); HF Accelerate's tensorboard tracker, unlike this runtime's, skips values that
    are neither numbers, tensors nor text (a numpy float32, say): pass `float(x)` there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from migrate.analysis import LibraryCall, Scope, Site, StmtRef
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.rules.base import MAX_LINE
from migrate.rules.guard_file_operations import (
    _unreachable_method,
    _unreadable_function,
    launcher_rank_test,
    outside_classes,
)
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
# wandb's media and data types: objects built in memory, with no run (`wandb.Image(x)` in the dict
# a guarded `run.log(...)` writes); built on every process, they are only logged by the main one
_WANDB_DATA = frozenset({
    "wandb.Image", "wandb.Histogram", "wandb.Table", "wandb.Video", "wandb.Audio", "wandb.Html",
    "wandb.Object3D", "wandb.Molecule", "wandb.Plotly", "wandb.Graph",
})
_LOGGING_SETUP = frozenset({"logging.basicConfig"})
# A logger class of the project that the migration cannot read (`from logger import Logger`, of a
# module it does not have), known by its name: a CamelCase name ending in Logger or Writer.
_USER_LOGGER = re.compile(r"^([A-Z]\w*)?(Logger|Writer)$")
# An argument naming where it writes: a folder or path expression, or a literal path.
_LOG_FOLDER = re.compile(r"dir|path|folder|root|runs|logs?\b|/", re.IGNORECASE)
# An enclosing `if` that already restricts to one process (ours, or the script's own rank check).
_RANK_TEST = re.compile(r"main_process|rank|primary|master|is_main", re.IGNORECASE)


def apply(roles: Roles, plan: EditPlan) -> None:
    if roles.home is None or not roles.models or roles.refused or roles.accelerator_scope is None:
        return
    main_only = _main_process_classes(roles)
    found = [
        _Found(scope) for scope in roles.facts.scopes
        if not isinstance(scope.node, cst.ClassDef) and not _within(scope, main_only)
    ]
    writers = _WRITERS | _user_loggers(roles)
    for item in found:
        _collect(item, writers)
    consoles = {id(item): _console_setups(item.scope) for item in found if item.guarded}
    if any(id(s) in consoles[id(item)] for item in found if item.guarded for _, s in item.guarded) \
            and _levels_per_process(roles):
        # The script already decides what each process's loggers print: its console setup is meant
        # for every process (a guard would drop the lines it logs with `main_process_only=False`).
        # (Asked only when a console setup is to be guarded: the question walks every module.)
        for item in found:
            if item.guarded:
                item.guarded = [(f, s) for f, s in item.guarded if id(s) not in consoles[id(item)]]
    # `wandb.log` on a process without `wandb.init` raises: a family (wandb, mlflow) with a call that
    # cannot be guarded anywhere in the file stays on every process, everywhere.
    broken = {family for item in found for family, _, _ in item.problems if family}
    for item in found:
        if (item.guarded or item.problems) and (not roles.can_reach(item.scope)
                                                or _unreachable_method(roles, item.scope) is not None):
            broken.update(family for family, _ in item.guarded if family)  # logs on every process there
    _collect_attribute_writers(roles, plan, found)
    converted = _convert(roles, plan, found)
    for item in found:
        scope = item.scope
        if not item.guarded and not item.problems:
            continue
        if not roles.can_reach(scope) or _unreachable_method(roles, scope) is not None:
            first = item.guarded[0][1] if item.guarded else item.problems[0][1]
            if _launcher_rank_setup(roles, plan, item):
                continue
            if _console_logging_setup_only(item):
                # Console lines repeated on every process: cosmetic, nothing for the file to fail on.
                plan.report(
                    CODE, first,
                    f"`logging.basicConfig(...)` in `{scope.name}`, which cannot reach the accelerator, "
                    "stays on every process, so each log line it turns on is printed by every process "
                    "(console output only; training is unaffected): to print them once, move it below "
                    "the line that creates the accelerator, under `if accelerator.is_main_process:`",
                )
                continue
            plan.report(
                CODE, first,
                f"experiment logging in `{scope.name}`, which cannot reach the accelerator, runs on every "
                "process (N event files, runs or copies of each line): run it on the main process only "
                "(`if accelerator.is_main_process:`, passing `accelerator` in)", unconverted=True,
            )
            continue
        for _, node, message in item.problems:
            plan.report(CODE, node, message, unconverted=True)
        guarded = [stmt for family, stmt in item.guarded if family not in broken and stmt not in converted]
        for stmt in guarded:
            if stmt not in plan.main_process_only:
                plan.main_process_only.add(stmt)
                plan.change(CODE, stmt, "experiment logging on the main process only")
        if guarded:
            plan.use_accelerator(scope)


def _launcher_rank_setup(roles: Roles, plan: EditPlan, item: _Found) -> bool:
    """Everything to guard in a scope no Accelerator reaches (module level, or a plain function of
    the script that runs before or without the one that creates it) is `logging.basicConfig(...)`:
    it runs under `if int(os.environ.get("RANK", "0")) == 0:`, the launcher's rank, as prints and
    file writes there do (the others keep Python's logging defaults, as under
    `if accelerator.is_main_process:`). True when done."""
    scope = item.scope
    if item.problems or not item.guarded or not outside_classes(roles, scope):
        return False
    setups = {id(c.where.stmt) for c in scope.library_calls if c.qualified in _LOGGING_SETUP}
    if not all(id(stmt) in setups for _, stmt in item.guarded):
        return False
    for _, stmt in item.guarded:
        if stmt in plan.main_process_only or stmt in plan.replace_stmt or stmt in plan.launcher_rank_only:
            continue
        plan.launcher_rank_only[stmt] = launcher_rank_test(roles, plan)
        plan.change(CODE, stmt, "`logging.basicConfig(...)` runs where no Accelerator exists: on the launcher's "
                    "rank 0 only (`RANK`, which `accelerator.is_main_process` is made from); the other processes "
                    "keep Python's logging defaults (warnings and errors still reach stderr)")
    return True


def _console_logging_setup_only(item: _Found) -> bool:
    """Everything to guard in `item` is `logging.basicConfig(...)` writing to the console: no
    `filename=` and no `handlers=` (a file handler writes a file on every process)."""
    if item.problems or not item.guarded:
        return False
    console = _console_setups(item.scope)
    return all(id(stmt) in console for _, stmt in item.guarded)


def _console_setups(scope: Scope) -> set[int]:
    """The statements (by id) of `scope` that are a `logging.basicConfig(...)` writing to the
    console only: no `filename=`, no `handlers=`, no `**options`."""
    return {
        id(c.where.stmt) for c in scope.library_calls
        if c.qualified in _LOGGING_SETUP and not any(
            arg.keyword is not None and arg.keyword.value in ("filename", "handlers") or arg.star
            for arg in c.call.args
        )
    }


# Loggers whose calls print on the main process only unless told otherwise (`main_process_only=False`).
_PROCESS_LOGGERS = frozenset({"accelerate.logging.get_logger"})
# Calls that set what a logger prints: `logger.setLevel(...)`, `transformers.utils.logging.
# set_verbosity_error()`, `logging.disable(...)`.
_LEVEL_SETTER = re.compile(r"^(setLevel|set_verbosity(_[a-z]+)?|disable)$")


def _levels_per_process(roles: Roles) -> bool:
    """The program already chooses per process what its loggers print: it logs through a logger
    that prints on the main process only (HF Accelerate's `get_logger`), or sets a level that
    depends on the process (`logger.setLevel(logging.INFO if accelerator.is_local_main_process else
    logging.ERROR)`, `set_verbosity_error()` in the `else` of `if args.local_rank in (-1, 0):`)."""
    if any(c.qualified in _PROCESS_LOGGERS for scope in roles.facts.scopes for c in scope.library_calls):
        return True
    finder = _LevelPerProcess()
    for scope in roles.facts.scopes:
        if isinstance(scope.node, cst.Module):
            walk(scope.node, finder)
    return finder.found


class _LevelPerProcess(cst.CSTVisitor):
    """Finds a level-setting call (`_LEVEL_SETTER`) whose arguments, or an enclosing `if`'s test,
    read which process this is (`_RANK_TEST`). The tests are generated as code only at such a call:
    most programs have many `if`s and no level setter."""

    def __init__(self) -> None:
        self.found = False
        self._ifs: list[cst.If] = []

    def visit_If(self, node: cst.If) -> None:
        self._ifs.append(node)

    def leave_If(self, original_node: cst.If) -> None:
        self._ifs.pop()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self.found or not isinstance(func, cst.Attribute) or not _LEVEL_SETTER.match(func.attr.value):
            return
        tested = [arg.value for arg in node.args] + [enclosing.test for enclosing in self._ifs]
        if any(_RANK_TEST.search(_EMPTY.code_for_node(expr)) for expr in tested):
            self.found = True


def _within(scope: Scope, classes: set[int]) -> bool:
    """`scope` is (nested in) a method of one of `classes` (by the id of their scopes)."""
    current: Scope | None = scope.parent
    while current is not None:
        if id(current) in classes:
            return True
        current = current.parent
    return False


def _main_process_classes(roles: Roles) -> set[int]:
    """The classes (ids of their scopes) whose instances exist on the main process only: every
    mention of the class's name, in every module the unit reaches (`utils.TensorboardLogger` in
    `main.py` as well as `TensorboardLogger` in `utils.py`), is a call that builds one in the body
    of an `if` true on the main process only (`if global_rank == 0 and args.log_dir:`, `if
    accelerator.is_main_process:`). Their methods run on the main process only, whatever they log.
    A subclass, a reference passed on, a call in an `else` branch or outside any such `if`
    leaves the class out."""
    logging = {id(scope.parent) for scope in roles.facts.scopes
               if scope.is_method and any(_is_logging(c.qualified) for c in scope.library_calls)}
    classes = {name: scope for name, scope in roles.facts.classes.items() if id(scope) in logging}
    if not classes:
        return set()  # no method logs (nested functions of methods are not looked for: left as before)
    modules = [scope.node for scope in roles.facts.scopes if isinstance(scope.node, cst.Module)]
    mentions = _ClassMentions(set(classes))
    for module in modules:
        walk(module, mentions)
    found: set[int] = set()
    for name, scope in classes.items():
        sites = mentions.found.get(name)
        if sites and all(guarded for guarded in sites):
            found.add(id(scope))
    return found


class _ClassMentions(cst.CSTVisitor):
    """For each of `names`: whether each mention (a `Name`, or the attribute of `module.Name`) is
    the callee of a call made in the body of an `if` true on the main process only (True) or
    anything else (False). The names defined by `class` statements are not mentions."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.found: dict[str, list[bool]] = {}
        self._main = 0
        self._callees: set[int] = set()

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        for part in (*node.bases, *node.keywords, *node.decorators):
            walk(part, self)
        walk(node.body, self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        # a function body runs where it is called, not where it is defined
        main, self._main = self._main, 0
        for part in (node.params, *node.decorators):
            walk(part, self)
        walk(node.body, self)
        self._main = main
        return False

    def visit_If(self, node: cst.If) -> bool:
        walk(node.test, self)
        main_only = _main_process_test(node.test)
        self._main += main_only
        walk(node.body, self)
        self._main -= main_only
        if node.orelse is not None:
            # `else` / `elif`: where the test is false (main only after `if rank != 0:`)
            main, self._main = self._main, int(_main_process_test(node.test, negated=True))
            walk(node.orelse, self)
            self._main = main
        return False

    def visit_Call(self, node: cst.Call) -> None:
        if self._main:
            self._callees.add(id(node.func))

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        # `from utils import Logger` names the class without using it; `... import Logger as L`
        # hides its uses under another name: not followed
        if not isinstance(node.names, cst.ImportStar):
            for alias in node.names:
                if isinstance(alias.name, cst.Name) and alias.name.value in self.names and alias.asname is not None:
                    self.found.setdefault(alias.name.value, []).append(False)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.found.setdefault(node.value, []).append(id(node) in self._callees)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if node.attr.value in self.names:
            self.found.setdefault(node.attr.value, []).append(id(node) in self._callees)
        walk(node.value, self)
        return False


_MAIN_FLAG = re.compile(r"(^|[._])(is_main_process|is_local_main_process|is_master|master_process|is_main)(\(\))?$")


def _main_process_test(test: cst.BaseExpression, negated: bool = False) -> bool:
    """True only on the main process: `rank == 0` (any name ending in `rank`), `is_main_process`
    (a flag or a call), or an `and` with one such side. `negated`: false only on the main process
    (`rank != 0`, `not is_main_process`), so that its `else` runs there only."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return _main_process_test(test.expression, not negated)
    if isinstance(test, cst.BooleanOperation):
        either = isinstance(test.operator, cst.Or) if negated else isinstance(test.operator, cst.And)
        if either:
            return _main_process_test(test.left, negated) or _main_process_test(test.right, negated)
        return _main_process_test(test.left, negated) and _main_process_test(test.right, negated)
    if negated and not isinstance(test, cst.Comparison):
        return False
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        return (
            isinstance(target.operator, cst.NotEqual if negated else cst.Equal)
            and isinstance(target.comparator, cst.Integer)
            and target.comparator.value == "0"
            and re.search(r"(^|[._])rank(\(\))?$", _EMPTY.code_for_node(test.left).strip()) is not None
        )
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call)):
        return _MAIN_FLAG.search(_EMPTY.code_for_node(test).strip()) is not None
    return False


@dataclass(eq=False)
class _Found:
    scope: Scope
    guarded: list[tuple[str, cst.BaseStatement]] = field(default_factory=list)  # (family, statement)
    problems: list[tuple[str, cst.CSTNode, str]] = field(default_factory=list)  # (family, node, message)
    # Writers used only as receivers of logging statements: (name, creating call, those statements).
    writers: list[tuple[str, LibraryCall, list[Site]]] = field(default_factory=list)
    unconvertible: set[str] = field(default_factory=set)  # tracker kinds seen here that cannot convert
    attribute_writers: list[tuple[str, LibraryCall]] = field(default_factory=list)  # `self.<attr> = SummaryWriter()`


def _user_loggers(roles: Roles) -> frozenset[str]:
    """Logger classes the migration cannot read, by qualified name (`logger.Logger`): a CamelCase
    class ending in Logger or Writer, imported from a module that is neither the standard library's
    nor one of the unit's (no class of that name in the files read), built where the accelerator
    can reach and handed a folder or a path (`Logger(self.log_dir)`, `TBLogger(args.log_dir)`,
    `ExperimentLogger("runs/exp")`; not `MetricLogger(delimiter="  ")`, which only prints). Its
    object is a log writer like a SummaryWriter: created and written to on the main process only,
    or reported."""
    classes = {s.name for s in roles.facts.scopes if isinstance(s.node, cst.ClassDef)}
    found: set[str] = set()
    for scope in roles.facts.scopes:
        for call in scope.library_calls:
            last = call.qualified.rsplit(".", 1)[-1]
            if call.qualified in found or call.qualified in _WRITERS or last in classes or not _USER_LOGGER.match(last):
                continue
            if not (roles.can_reach(scope) and _unreachable_method(roles, scope) is None):
                continue  # its name is all the migration knows of it: where no guard can go, left alone
            if _unreadable_function(roles, scope, call.call) is not None and any(
                    _LOG_FOLDER.search(_EMPTY.code_for_node(arg.value)) for arg in call.call.args):
                found.add(call.qualified)
    return frozenset(found)


def _family(qualified: str) -> str:
    """Calls that must all be guarded or none: a module API with its own global run state."""
    head = qualified.split(".", 1)[0]
    return head if head in ("wandb", "mlflow") else ""


def _collect(item: _Found, known_writers: frozenset[str]) -> None:
    scope = item.scope
    writers: dict[str, LibraryCall] = {}  # name -> the call that created it
    logging_stmts: set[int] = set()
    calls = [c for c in scope.library_calls if _is_logging(c.qualified) or c.qualified in known_writers]
    for call in calls:
        kind = _statement_kind(call.where.stmt, call.call)
        attribute = _attribute_target(scope, call, known_writers)
        if attribute is not None:
            logging_stmts.add(id(call.where.stmt))
            item.attribute_writers.append((attribute, call))  # its uses are in other methods too
            continue
        if kind == "expression" or (kind is not None and call.qualified in known_writers):
            logging_stmts.add(id(call.where.stmt))
            if kind != "expression":
                writers.setdefault(kind, call)
            if not _already_guarded(call.where):
                item.guarded.append((_family(call.qualified), call.where.stmt))
    for call in calls:
        if id(call.where.stmt) in logging_stmts:
            continue  # `wandb.log({"img": wandb.Image(x)})`: inside a guarded statement
        # Part of an expression, a `with`, or `x = wandb.Image(...)`: not a statement to guard.
        item.problems.append((_family(call.qualified), call.call, _unguardable_call(call.qualified, call.where.stmt)))
        item.unconvertible.add(_tracker_kind(call.qualified))
    for name, creation in writers.items():
        created_by = creation.qualified
        sites, bad = _writer_uses(scope, name)
        family = _family(created_by)
        if bad is not None and _main_only_writer(scope, name):
            # The script's own `if rank == 0: w = Writer(...) else: w = None`: it exists on the
            # main process only already, and every use is the script's (`if w is not None:`).
            item.unconvertible.add(_tracker_kind(created_by))
            continue
        if bad is not None:
            item.problems.append((family, bad, _unguardable_writer(name, created_by)))
            item.unconvertible.add(_tracker_kind(created_by))
            # Its creation stays on every process: so does every statement writing through it.
            creations = {id(b.where.stmt) for b in scope.bindings.get(name, [])}
            item.guarded = [(f, s) for f, s in item.guarded if id(s) not in creations]
            continue
        item.guarded.extend((family, s.where.stmt) for s in sites if not _already_guarded(s.where))
        item.writers.append((name, creation, sites))


def _attribute_target(scope: Scope, call: LibraryCall, writers: frozenset[str]) -> str | None:
    """`attr` for `self.attr = SummaryWriter(...)` (or `= wandb.init(...)`) in a method, else None."""
    stmt = call.where.stmt
    if not (scope.is_method and scope.params and call.qualified in writers):
        return None
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not (isinstance(small, cst.Assign) and small.value is call.call and len(small.targets) == 1):
        return None
    target = small.targets[0].target
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == scope.params[0]:
        return target.attr.value
    return None


def _collect_attribute_writers(roles: Roles, plan: EditPlan, found: list[_Found]) -> None:
    """A writer kept as `self.writer` is guarded like a local one when every use of it, in every
    method of the class, is a `self.writer.method(...)` statement: those run on the main process
    only, with its creation. So is a read in a statement that runs on the main process only anyway
    (`save_config_file(self.writer.log_dir, ...)` guarded by checkpoints-and-output,
    `logging.basicConfig(filename=os.path.join(self.writer.log_dir, ...))` guarded here), and a
    `logging` call reading it (`logging.info(f"saved at {self.writer.log_dir}")`), which then runs on
    the main process only too (on the others the root logger, left unconfigured, drops info lines
    anyway). Any other use (passed on, read in an expression, rebound, used by a nested function)
    leaves all of them on every process, reported."""
    items = {id(item.scope): item for item in found}
    main_only = {id(stmt) for stmt in plan.main_process_only}
    main_only.update(id(stmt) for item in found for _, stmt in item.guarded)
    for item in found:
        for attribute, creation in item.attribute_writers:
            owner = item.scope.parent
            methods = [s for s in roles.facts.scopes if s.parent is owner and s.params]
            family = _family(creation.qualified)
            uses: list[tuple[_Found, cst.BaseStatement]] = []
            bad: cst.CSTNode | None = None
            for method in methods:
                finder = _AttributeUses(method.params[0], attribute, creation.where.stmt, main_only,
                                        roles.facts.aliases.qualify)
                walk(method.node, finder)
                if finder.bad is not None:
                    bad = finder.bad
                    break
                method_item = items.get(id(method))
                if method_item is None:
                    bad = method.node
                    break
                uses.extend((method_item, stmt) for stmt in finder.statements)
                uses.extend((method_item, stmt) for stmt in finder.log_lines)
            if bad is None:
                # `trainer.writer` outside the class, or a subclass's `self.writer`: not followed.
                counts = {id(m.node): _attribute_count(m.node, attribute, {}) for m in methods}
                if _attribute_count(roles.facts.module, attribute, counts) > sum(counts.values()):
                    bad = creation.call
            if bad is not None:
                item.problems.append((family, bad, _unguardable_writer(f"self.{attribute}", creation.qualified)))
                item.unconvertible.add(_tracker_kind(creation.qualified))
                continue
            what = _unreachable_method(roles, item.scope)
            if what is not None:
                # its methods cannot read `self.accelerator`: the guard would raise AttributeError
                short = creation.qualified.rsplit(".", 1)[-1]
                item.problems.append((family, creation.call, (
                    f"`self.{attribute}` (from `{short}(...)`) is created in `{item.scope.qualname}`, a method of "
                    f"{what}, which cannot reach the accelerator: its logging runs on every process (N event files "
                    "or runs); hand the class the accelerator and create it under "
                    "`if accelerator.is_main_process:`, with its writes")))
                item.unconvertible.add(_tracker_kind(creation.qualified))
                continue
            if not _already_guarded(creation.where):
                item.guarded.append((family, creation.where.stmt))
            for method_item, stmt in uses:
                method_item.guarded.append((family, stmt))


def _attribute_count(root: cst.CSTNode, attribute: str, known: dict[int, int]) -> int:
    """How many `<anything>.<attribute>` nodes `root` holds; `known`: the counts of some functions
    (by their node's id), already taken: they are not walked again."""
    counter = _AttributeCounter(attribute, known)
    walk(root, counter)
    return counter.count


class _AttributeCounter(cst.CSTVisitor):
    def __init__(self, attribute: str, known: dict[int, int]) -> None:
        self.attribute = attribute
        self.known = known
        self.count = 0

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.count += node.attr.value == self.attribute

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        known = self.known.get(id(node))
        if known is None:
            return True
        self.count += known
        return False


class _AttributeUses(cst.CSTVisitor):
    """In one method: the statements `self.<attr>.method(...)` not already under a rank check
    (`statements`), and the first other read of `self.<attr>` (`bad`)."""

    def __init__(self, instance: str, attribute: str, creation: cst.BaseStatement, main_only: set[int],
                 qualify: Callable[[cst.BaseExpression], str | None]) -> None:
        self.instance = instance
        self.attribute = attribute
        self.creation = creation
        self.main_only = main_only  # statements that run on the main process only anyway
        self.qualify = qualify
        self.statements: list[cst.BaseStatement] = []
        self.log_lines: list[cst.BaseStatement] = []  # `logging.info(...)` statements reading it
        self.bad: cst.CSTNode | None = None
        self._guards = 0
        self._depth = 0

    def _is_writer(self, node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value == self.instance
            and node.attr.value == self.attribute
        )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self._depth += 1
        return True

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_If(self, node: cst.If) -> None:
        if _RANK_TEST.search(_EMPTY.code_for_node(node.test)):
            self._guards += 1

    def leave_If(self, original_node: cst.If) -> None:
        if _RANK_TEST.search(_EMPTY.code_for_node(original_node.test)):
            self._guards -= 1

    def visit_With(self, node: cst.With) -> bool:
        return id(node) not in self.main_only

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        if id(node) in self.main_only:
            return False  # on the main process only, where the writer exists
        if self._guards == 0 and self._depth <= 1 and self._log_line(node) and self._reads_writer(node):
            self.log_lines.append(node)
            return False
        if node is self.creation:
            small = node.body[0]
            assert isinstance(small, cst.Assign)
            walk(small.value, self)
            return False
        small = node.body[0] if len(node.body) == 1 else None
        if (
            isinstance(small, cst.Expr)
            and isinstance(small.value, cst.Call)
            and isinstance(small.value.func, cst.Attribute)
            and self._is_writer(small.value.func.value)
            and self._depth <= 1  # a nested function may run anywhere
        ):
            if not self._guards:
                self.statements.append(node)
            for arg in small.value.args:
                walk(arg, self)
            return False
        return True

    def _log_line(self, node: cst.SimpleStatementLine) -> bool:
        """`logging.info(...)` (any `logging` function) as a whole statement."""
        small = node.body[0] if len(node.body) == 1 else None
        return (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)
                and (self.qualify(small.value.func) or "").startswith("logging."))

    def _reads_writer(self, node: cst.SimpleStatementLine) -> bool:
        reads = _WriterReads(self)
        walk(node, reads)
        return reads.found

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if self._is_writer(node) and self.bad is None:
            self.bad = node
        return True


class _WriterReads(cst.CSTVisitor):
    def __init__(self, uses: _AttributeUses) -> None:
        self.uses = uses
        self.found = False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.found = self.found or self.uses._is_writer(node)


def _is_logging(qualified: str) -> bool:
    if qualified in _WANDB_DATA or qualified.startswith(("wandb.plot.", "wandb.data_types.")):
        return False  # a value to log, not a write
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


def _conditional(where: StmtRef) -> bool:
    """The statement runs only on some runs: inside an `if` (other than `if __name__ ==
    "__main__":`) or a `try`. `if args.track: import wandb; wandb.init(...)` is the common shape:
    converted, `log_with=` would start the tracker on every run, and the Accelerator would fail to
    start where the package is not installed (the original only imports it when asked to)."""
    for outer in where.path:
        stmt = outer.stmt
        if isinstance(stmt, cst.Try) or (isinstance(stmt, cst.If) and not _is_main_guard(stmt.test)):
            return True
    return False


def _is_main_guard(test: cst.BaseExpression) -> bool:
    """`__name__ == "__main__"` (either operand order)."""
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return False
    if type(test.comparisons[0].operator) is not cst.Equal:
        return False
    operands = (test.left, test.comparisons[0].comparator)
    return any(type(o) is cst.Name and o.value == "__name__" for o in operands) and any(
        type(o) is cst.SimpleString and o.evaluated_value == "__main__" for o in operands
    )


def _main_only_writer(scope: Scope, name: str) -> bool:
    """Every binding of `name` in `scope` is either a call made in the branch of an `if` taken on the
    main process only (`if global_rank == 0 and args.log_dir:`, the `else` of `if rank != 0:`) or
    `None`: the writer exists on the main process only, as the script wrote it."""
    bindings = scope.bindings.get(name, [])
    made = False
    for binding in bindings:
        value = binding.value
        if isinstance(value, cst.Name) and value.value == "None":
            continue
        if not isinstance(value, cst.Call) or not _in_main_branch(binding.where):
            return False
        made = True
    return made


def _in_main_branch(where: StmtRef) -> bool:
    """The statement sits in the body of an `if` true on the main process only, or in the `else`
    of one false there only (`if rank != 0:`)."""
    for outer, nested in zip(where.path, (*where.path[1:], where)):
        stmt = outer.stmt
        if not isinstance(stmt, cst.If):
            continue
        if nested.block is stmt.body and _main_process_test(stmt.test):
            return True
        if (isinstance(stmt.orelse, cst.Else) and nested.block is stmt.orelse.body
                and _main_process_test(stmt.test, negated=True)):
            return True
    return False


def _writer_uses(scope: Scope, name: str) -> tuple[list[Site], cst.CSTNode | None]:
    """The statements `name.method(...)` of `scope`, and the first other read of `name` (None:
    every read is such a statement). A rebinding other than by the creating call counts too."""
    receivers: dict[int, Site] = {}
    for site in (*scope.method_calls, *scope.member_calls):
        # `run.log(...)`, and a method of one of its members (`run.config.update(...)`)
        root = site.receiver.value if isinstance(site.receiver, cst.Attribute) else site.receiver
        if isinstance(root, cst.Name) and root.value == name and _statement_kind(
            site.where.stmt, site.call
        ) == "expression":
            receivers[id(root)] = site
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
    last = created_by.rsplit(".", 1)[-1]
    short = last if created_by.endswith("SummaryWriter") or _USER_LOGGER.match(last) else created_by
    return (
        f"`{name}` (from `{short}(...)`) is used here other than by a logging statement (passed on, stored "
        f"or in an expression), so its logging stays on every process (N event files or runs): create it "
        f"with `{name} = {short}(...) if accelerator.is_main_process else None` and write through it under "
        f"`if {name} is not None:`"
    )


# -- conversion to the tracker API -------------------------------------------------------------

_LOG_DIR_KEYWORD = {
    "torch.utils.tensorboard.SummaryWriter": "log_dir",
    "torch.utils.tensorboard.writer.SummaryWriter": "log_dir",
    "tensorboardX.SummaryWriter": "logdir",
}
# SummaryWriter arguments the tracker passes on unchanged (`init_kwargs={"tensorboard": {...}}`).
_WRITER_OPTIONS = frozenset({"comment", "purge_step", "max_queue", "flush_secs", "filename_suffix"})
_WANDB_CALLS = frozenset({"wandb.init", "wandb.log", "wandb.finish"})
_EMPTY = cst.Module([])


def _tracker_kind(qualified: str) -> str:
    return "tensorboard" if qualified.endswith("SummaryWriter") else qualified.split(".", 1)[0]


def _convert(roles: Roles, plan: EditPlan, found: list[_Found]) -> set[cst.BaseStatement]:
    """Convert one kind of logging (a SummaryWriter, else wandb) to the tracker API where that is
    provably the same log; return the statements converted (the rest is guarded as before).

    One kind only: with `log_with=["tensorboard", "wandb"]` every `accelerator.log` would write to
    both, where the script wrote some values to one and some to the other."""
    if roles.accelerator_exists or "log_with" in plan.accelerator_kwargs:
        return set()  # an existing Accelerator's arguments are the script's own
    for convert in (_convert_tensorboard, _convert_wandb):
        done = convert(roles, plan, found)
        if done:
            plan.removes_boilerplate = True  # `from torch.utils.tensorboard import SummaryWriter` may go
            return done
    return set()


def _convert_tensorboard(roles: Roles, plan: EditPlan, found: list[_Found]) -> set[cst.BaseStatement]:
    if any("tensorboard" in item.unconvertible for item in found):
        return set()
    writers = [(item, w) for item in found for w in item.writers if _tracker_kind(w[1].qualified) == "tensorboard"]
    if len(writers) != 1:
        return set()  # two writers would be two trackers of one kind: the API has one
    item, (name, creation, sites) = writers[0]
    where = _log_dir(creation)
    if (
        where is None
        or not roles.can_reach(item.scope)
        or creation.where.in_loop
        or _already_guarded(creation.where)
        or _conditional(creation.where)
        or len(item.scope.bindings.get(name, [])) != 1
    ):
        return set()
    edits: list[tuple[Site, str]] = []
    for site in sites:
        assert isinstance(site.call.func, cst.Attribute)
        method = site.call.func.attr.value
        if _already_guarded(site.where):
            return set()
        if method == "add_scalar" and _scalar_args(site.call) is not None:
            edits.append((site, method))
        elif method in ("flush", "close") and not site.call.args:
            edits.append((site, method))
        else:
            return set()  # add_histogram, add_image, ...: only the writer can write those
    project_dir, run_name, options = where
    plan.accelerator_kwargs["log_with"] = '"tensorboard"'
    plan.accelerator_kwargs["project_dir"] = project_dir
    args = [run_name] + ([f'init_kwargs={{"tensorboard": {{{options}}}}}'] if options else [])
    stmt = creation.where.stmt
    init = _wrapped("accelerator.init_trackers", args, _indent(creation.where))
    plan.replace_stmt[stmt] = [_statement_like(stmt, init)]
    plan.change(CODE, stmt, f"`{name}` is the tensorboard tracker: `init_trackers({run_name})` under project_dir={project_dir}")
    converted = {stmt}
    for site, method in edits:
        stmt = site.where.stmt
        converted.add(stmt)
        if method == "add_scalar":
            plan.calls[site.call] = _scalar_to_log
            plan.change(CODE, stmt, f"`{name}.add_scalar` is `accelerator.log` (main process only)")
        elif method == "flush":
            plan.replace_stmt[stmt] = []  # the tracker flushes after every log
            plan.change(CODE, stmt, f"`{name}.flush()` removed: the tracker flushes after every log")
        else:
            plan.calls[site.call] = lambda _: _finish_call("tensorboard")
            plan.change(CODE, stmt, f"`{name}.close()` closes the tensorboard tracker")
    plan.use_accelerator(item.scope)
    return converted


def _log_dir(creation: LibraryCall) -> tuple[str, str, str] | None:
    """For `SummaryWriter("runs/exp", flush_secs=10)`: the project_dir and run name whose join is
    that directory (`"runs"`, `"exp"`), and the other options as dict items; None unless the
    directory is a string literal (only then is the split known here)."""
    keyword = _LOG_DIR_KEYWORD[creation.qualified]
    directory: cst.BaseExpression | None = None
    options: list[str] = []
    for index, arg in enumerate(creation.call.args):
        if arg.star:
            return None
        name = arg.keyword.value if arg.keyword is not None else None
        if (name is None and index == 0) or name == keyword:
            directory = arg.value
        elif name in _WRITER_OPTIONS and keyword == "log_dir":
            options.append(f'"{name}": {_EMPTY.code_for_node(arg.value)}')
        else:
            return None
    if not isinstance(directory, cst.SimpleString):
        return None  # `SummaryWriter()` (a dated directory), `SummaryWriter(args.log_dir)`
    path = directory.evaluated_value
    if not isinstance(path, str):
        return None
    head, _, tail = path.rstrip("/").rpartition("/")
    if tail in ("", ".", ".."):
        return None
    project_dir = head or ("/" if path.startswith("/") else ".")
    return json.dumps(project_dir, ensure_ascii=False), json.dumps(tail, ensure_ascii=False), ", ".join(options)


def _scalar_args(call: cst.Call) -> tuple[cst.BaseExpression, cst.BaseExpression, cst.BaseExpression | None] | None:
    """`add_scalar(tag, value[, step])` (step also as `global_step=`); None for any other shape
    (`walltime=`, `new_style=`, ...)."""
    positional: list[cst.BaseExpression] = []
    step: cst.BaseExpression | None = None
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None and step is None:
            positional.append(arg.value)
        elif arg.keyword is not None and arg.keyword.value == "global_step" and len(positional) == 2:
            step = arg.value
        else:
            return None
    if len(positional) == 3 and step is None:
        positional, step = positional[:2], positional[2]
    if len(positional) != 2:
        return None
    return positional[0], positional[1], step


def _scalar_to_log(updated: cst.Call) -> cst.BaseExpression:
    """`writer.add_scalar(tag, value, step)` -> `accelerator.log({tag: value}, step=step)`."""
    parts = _scalar_args(updated)
    assert parts is not None
    tag, value, step = parts
    args = [cst.Arg(cst.Dict([cst.DictElement(tag, value)]))]
    if step is not None:
        args.append(_keyword("step", step))
    return cst.Call(cst.Attribute(cst.Name("accelerator"), cst.Name("log")), args)


def _convert_wandb(roles: Roles, plan: EditPlan, found: list[_Found]) -> set[cst.BaseStatement]:
    if any("wandb" in item.unconvertible for item in found):
        return set()
    if any(_tracker_kind(w[1].qualified) == "wandb" for item in found for w in item.writers):
        return set()  # `run = wandb.init(...)`: the run object is used, the tracker API has none
    calls = [(item, c) for item in found for c in item.scope.library_calls if c.qualified.startswith("wandb.")]
    inits = [c for _, c in calls if c.qualified == "wandb.init"]
    if len(inits) != 1 or inits[0].where.in_loop or _conditional(inits[0].where):
        return set()
    for item, call in calls:
        if (
            call.qualified not in _WANDB_CALLS  # wandb.watch, wandb.Image, wandb.config...
            or _statement_kind(call.where.stmt, call.call) != "expression"
            or _already_guarded(call.where)
            or not roles.can_reach(item.scope)
            or _wandb_edit(call, 0) is None
        ):
            return set()
    plan.accelerator_kwargs["log_with"] = '"wandb"'
    converted: set[cst.BaseStatement] = set()
    for item, call in calls:
        plan.calls[call.call] = _wandb_edit(call, _indent(call.where))  # type: ignore[assignment]
        converted.add(call.where.stmt)
        plan.change(CODE, call.where.stmt, f"`{call.qualified}` is the wandb tracker's")
        plan.use_accelerator(item.scope)
    return converted


def _wandb_edit(call: LibraryCall, indent: int) -> Callable[[cst.Call], cst.BaseExpression] | None:
    """The edit turning this wandb call into the tracker API, or None when its arguments have no
    equivalent there."""
    args = call.call.args
    if any(arg.star for arg in args):
        return None
    keywords = {arg.keyword.value: arg for arg in args if arg.keyword is not None}
    if call.qualified == "wandb.init":
        if len(keywords) != len(args) or "project" not in keywords:
            return None  # without a project name wandb picks one; init_trackers needs one
        return lambda updated: _init_to_trackers(updated, indent)
    if call.qualified == "wandb.log":
        positional = len(args) - len(keywords)
        if positional != 1 or args[0].keyword is not None or set(keywords) - {"step"}:
            return None  # `commit=`, `data=`: no tracker-API spelling
        return lambda updated: updated.with_changes(func=cst.Attribute(cst.Name("accelerator"), cst.Name("log")))
    if call.qualified == "wandb.finish" and not args:
        return lambda _: _finish_call("wandb")
    return None


def _init_to_trackers(updated: cst.Call, indent: int) -> cst.BaseExpression:
    """`wandb.init(project=P, config=C, name=N)` ->
    `accelerator.init_trackers(P, config=C, init_kwargs={"wandb": {"name": N}})`."""
    keywords = {arg.keyword.value: _EMPTY.code_for_node(arg.value) for arg in updated.args if arg.keyword is not None}
    args = [keywords.pop("project")]
    if "config" in keywords:
        args.append(f"config={keywords.pop('config')}")
    if keywords:
        options = ", ".join(f'"{key}": {value}' for key, value in keywords.items())
        args.append(f'init_kwargs={{"wandb": {{{options}}}}}')
    return cst.parse_expression(_wrapped("accelerator.init_trackers", args, indent))


def _indent(where: StmtRef) -> int:
    """Columns of indentation of the statement: 4 per enclosing statement (def and class included)."""
    return 4 * len(where.path)


def _wrapped(function: str, args: list[str], indent: int) -> str:
    """`function(args)`, its arguments on an indented line of their own (as black does) when the
    call would pass MAX_LINE columns at `indent`."""
    one_line = f"{function}({', '.join(args)})"
    if indent + len(one_line) <= MAX_LINE:
        return one_line
    pad = " " * indent
    return f"{function}(\n{pad}    {', '.join(args)}\n{pad})"


def _finish_call(kind: str) -> cst.BaseExpression:
    """`accelerator.get_tracker(kind).finish()`: closes that tracker only (`end_training` would
    also end the process group, which the script may still use after this line)."""
    return cst.parse_expression(f'accelerator.get_tracker("{kind}").finish()')


def _keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def _statement_like(original: cst.BaseStatement, code: str) -> cst.BaseStatement:
    """`code` as a statement with `original`'s leading comments and trailing comment."""
    new = cst.parse_statement(code + "\n").with_changes(leading_lines=original.leading_lines)
    if isinstance(original, cst.SimpleStatementLine):
        new = new.with_changes(trailing_whitespace=original.trailing_whitespace)
    return new
