"""File operations of checkpoints-and-output (AM009) run on the main process only.

Part of the AM009 rule (its docstring, in `checkpoints_and_output.py`, documents the behaviour):
the script's own file writes (`open(path, "w")`, `plt.savefig`, `save_image`, `df.to_csv`, a
`torch.save` of something else than the model, status lines), downloads and unpacking, removals,
renames and copies in the block of a main-process write, folders made after a test that they are
missing, functions of the script that are one file operation (run whole on the main process), the
barrier before a file written and read back, and the report of a file written once per batch of a
loader prepared for training. Also the checks the whole rule shares: a rank check around a
statement, a path naming the process's rank, what in a statement every process must run.
"""

from __future__ import annotations

import builtins
import re
import sys
from dataclasses import dataclass

import libcst as cst

from migrate.analysis import LibraryCall, Scope, StmtRef
from migrate.names import call_argument, dotted_name, target_names
from migrate.edits import EditPlan
from migrate.roles import Roles
from migrate.roles.loaders import held_by_the_class
from migrate.roles.model import nested_in
from migrate.rules.base import reference
from migrate.rules.create_accelerator import _group_initialisers, _initialises_group
from migrate.walk import Visitor, walk

CODE = "AM009"  # its findings are checkpoints-and-output's

# An `if` only some processes pass (a rank check, ours or the script's own).
_RANK_TEST = re.compile(r"main_process|rank|primary|master", re.IGNORECASE)



def _whole_file_operations(roles: Roles, plan: EditPlan) -> set[int]:
    """The functions of the script that are one file operation, run whole on the main process.

    A function that downloads or unpacks (`extractall`, `urlretrieve`), or writes a file and then
    renames, copies or removes files, is one operation from its `if path.exists(): return` to its
    last `os.rename`: guarding its statements one by one leaves the rest on every process (a
    rename after the barrier: every process but one fails with FileNotFoundError), and a return
    before a barrier inside it would hang. So each statement calling it (a call of its own, the
    result unused) runs under `if accelerator.is_main_process:`, followed, for a download, by
    `accelerator.wait_for_everyone()`: the others wait for the data, and a function that skips
    files already there returns early on the main process alone. Not `main_process_first()`: the
    others would then run it again, downloading over the files the main process is reading when
    it does not skip them. Only when the function holds no collective, no model call and no
    `global`, and each call is a statement of its own; else its statements are guarded one by one,
    as any function's. A call where the accelerator cannot reach (at module level before the
    Accelerator exists) is reported, and the function left whole. Calls under a rank check (a
    second run), or inside a function run whole, are on the main process already: callers are
    decided first. Returns the ids of the functions run whole, and of the script's functions
    called only from them."""
    module = roles.facts.module_scope
    candidates: list[tuple[Scope, bool]] = []  # (function, downloads)
    for function in roles.facts.scopes:
        if not function.is_function or function.is_method:
            continue
        if not nested_in(function, module):
            # a function of another module of the run that saves with `torch.save` (`save_checkpoint(state)`
            # of utils.py: `torch.save(state, filename)`), which no rule guards inside it
            if not _saves_files(function) or _has_outside_effects(function) or _named_elsewhere(roles, function) \
                    or _mentions_rank(function.node):  # a file per rank (`f"ckpt_rank{rank}.pt"`): each process's own
                continue
            if roles.call_sites(function) and _hazard(roles, function, function.node, set()) is None:
                candidates.append((function, False))
            continue
        writes = _find_writes(roles, plan, function, module)
        fetches = any(w.fetch for w in writes)
        moves = any(c.qualified in _MOVERS | _REMOVERS for c in function.library_calls)
        if not (fetches or (writes and moves)) or _has_outside_effects(function):
            continue
        if _named_elsewhere(roles, function):
            continue  # passed as a callback too: calls nobody sees would lose its own guards
        if roles.call_sites(function) and _hazard(roles, function, function.node, set()) is None:
            candidates.append((function, fetches))
    # Callers first: a call inside a function that itself runs whole is on the main process
    # already (a barrier there would wait for processes that never come).
    whole: set[int] = set()
    undecided = {id(function) for function, _ in candidates}
    while undecided:
        ready = [(f, d) for f, d in candidates if id(f) in undecided and not any(
            id(caller) in undecided and caller is not f for caller, _ in roles.call_sites(f))]
        for function, fetches in ready or [c for c in candidates if id(c[0]) in undecided]:  # a cycle: as they are
            undecided.discard(id(function))
            if _run_whole(roles, plan, function, fetches, whole):
                whole.add(id(function))
    # The script's functions called only from those run on the main process too: nothing in them
    # is guarded again either.
    grown = True
    while grown:
        grown = False
        for scope in roles.facts.scopes:
            if id(scope) in whole or not scope.is_function or scope.is_method or not nested_in(scope, module):
                continue
            callers = roles.call_sites(scope)
            if callers and all(id(caller) in whole for caller, _ in callers):
                whole.add(id(scope))
                grown = True
    return whole


def _run_whole(roles: Roles, plan: EditPlan, function: Scope, fetches: bool, whole: set[int]) -> bool:
    """Put each call of `function` under `if accelerator.is_main_process:` (a download's followed by
    a barrier); False, with no edit, when some call cannot be (its result used, a collective in the
    statement); True with a report when a call cannot reach the accelerator (the function is then
    left whole)."""
    guard: list[tuple[Scope, StmtRef]] = []
    for caller, call in roles.call_sites(function):
        site = next((s for s in caller.calls if s.call is call), None)
        if site is None:
            return False
        where = site.where
        if id(caller) in whole or rank_guarded(where) or _goes_first(where):
            continue  # on the main process already (a second run sees our own `if`)
        stmt = where.stmt
        if not (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Expr
                and stmt.body[0].value is call):
            return False  # its result is used: the others need it
        if not roles.can_reach(caller) or _unreachable_method(roles, caller) is not None:
            # the function is left whole, and the call reported: guarded one by one inside,
            # its rename would still run on every process
            _report_unreachable_call(roles, plan, function, caller, call, fetches)
            return True
        # a download's call with the `if not os.path.exists(...)` / `with` around it: the barrier
        # after it is then outside any test a process could see otherwise
        unit = _fetch_unit(where) if fetches else where
        if _why_not_guarded(roles, caller, _Write("", call, where, fetches, None), unit) is not None:
            return False
        if unit.stmt in plan.replace_stmt or unit.stmt in plan.main_process_first:
            return False
        guard.append((caller, unit))
    for caller, unit in guard:
        if unit.stmt in plan.main_process_only:
            continue
        plan.main_process_only.add(unit.stmt)
        plan.use_accelerator(caller)
        if fetches:
            plan.insert_after[unit.stmt] = [*plan.insert_after.get(unit.stmt, []),
                                            cst.parse_statement("accelerator.wait_for_everyone()\n")]
            plan.change(CODE, unit.stmt, (
                f"`{function.name}(...)` downloads and unpacks files as a whole: it runs on the main process "
                "only, and the others wait for it (`accelerator.wait_for_everyone()`) before reading them"))
        elif not nested_in(function, roles.facts.module_scope):
            plan.change(CODE, unit.stmt, (
                f"`{function.name}(...)`, a function of another module of the run, saves files with `torch.save`: "
                "it runs on the main process only"))
        else:
            plan.change(CODE, unit.stmt, (
                f"`{function.name}(...)` writes files and then renames, copies or removes them: it runs "
                "on the main process only, as a whole"))
    return True


def _report_unreachable_call(roles: Roles, plan: EditPlan, function: Scope, caller: Scope, call: cst.Call,
                             fetches: bool) -> None:
    """A call of a file-operation function where the accelerator cannot reach (at module level
    before the Accelerator exists, a function nothing hands it to): every process runs it at once."""
    made = roles.accelerator_scope
    if caller is roles.facts.module_scope and made is not None and made is not caller:
        place = f"at module level, before the Accelerator (created in `{made.qualname}`) exists"
    else:
        place = f"in `{caller.qualname}`, where the accelerator cannot reach"
    what = "downloads and unpacks files" if fetches else "writes files and then renames, copies or removes them"
    where = f" in `{made.qualname}`" if made is not None and made is not roles.facts.module_scope else ""
    plan.report(CODE, call, (
        f"`{function.name}(...)` {what}, and it is called {place}: every process runs it at once, on the same "
        f"files (a file another process already moved is not found). Call it after the Accelerator is "
        f"created{where}, where its call runs on the main process only and the others wait for it, or fetch the "
        "data once before launching"), unconverted=True)


def _saves_files(function: Scope) -> bool:
    """`torch.save(...)` in the function's own body."""
    return any(c.qualified == "torch.save" for c in function.library_calls)


# Methods that change the object they are called on (`paths.append(p)` on a parameter).
_MUTATORS = frozenset({"append", "extend", "insert", "update", "add", "setdefault", "pop", "remove", "clear"})


def _has_outside_effects(function: Scope) -> bool:
    """The function changes something its callers see besides files: `global x` / `nonlocal x`, an
    attribute or item of a parameter or a global set (`cfg.path = target`), or a parameter changed
    in place (`found.append(path)`). Run on the main process only, the others would lack it."""
    params = set(function.params)

    def outside(target: cst.BaseExpression) -> bool:
        while type(target) in (cst.Attribute, cst.Subscript):
            target = target.value  # type: ignore[attr-defined]
        return type(target) is cst.Name and (target.value in params or not function.binds(target.value))

    class Finder(Visitor):
        found = False

        def visit_Global(self, node: cst.Global) -> None:
            self.found = True

        def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
            self.found = True

        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            self._target(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            self._target(node.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            self._target(node.target)

        def _target(self, target: cst.BaseExpression) -> None:
            if type(target) in (cst.Attribute, cst.Subscript) and outside(target):
                self.found = True

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if type(func) is cst.Attribute and func.attr.value in _MUTATORS and type(func.value) is cst.Name \
                    and func.value.value in params:
                self.found = True

    finder = Finder()
    walk(function.node, finder)
    return finder.found


def _named_elsewhere(roles: Roles, function: Scope) -> bool:
    """The function's name is read other than in the calls found (`pool.map(fetch, urls)`,
    `callbacks=[fetch]`, an attribute of the same name): some of its runs are not seen."""
    name = function.name

    class Count(Visitor):
        count = 0

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name:
                self.count += 1

    counter = Count()
    walk(roles.facts.module, counter)
    # each call names it once, and so does its `def`
    return counter.count > len(roles.call_sites(function)) + 1

def _unreachable_method(roles: Roles, scope: Scope) -> str | None:
    """What a method is when its class never holds the accelerator ("an nn.Module": built before
    the Accelerator and never handed one; "a class of the script": the Accelerator is created at
    module level, and nothing threads it into the class), else None."""
    owner = scope.parent
    if not scope.is_method or owner is None or type(owner.node) is not cst.ClassDef:
        return None
    if roles.accelerator_scope in (roles.methods_of(scope) or []):
        return None
    bases = [roles.facts.aliases.qualify(base.value) or "" for base in owner.node.bases]
    if any(base.rsplit(".", 1)[-1] == "Module" for base in bases):
        return "an nn.Module"
    if roles.accelerator_scope is roles.facts.module_scope and not roles.needs_parameter(scope):
        return "a class of the script"
    return None


_RANK_NAME = re.compile(r"(^|_)rank$|^process_index$|^get_rank$", re.IGNORECASE)


def rank_guarded(where: StmtRef) -> bool:
    """Inside an `if` whose test is a rank check (`if master_process:`, `if rank == 0:`)."""
    empty = cst.Module([])
    return any(type(outer.stmt) is cst.If and _RANK_TEST.search(empty.code_for_node(outer.stmt.test))
               for outer in where.path)
# -- other file writes -------------------------------------------------------------------------

# Library calls that write a file (the statement holding one runs on the main process only).
_FILE_WRITERS = frozenset({"torchvision.utils.save_image", "matplotlib.pyplot.savefig", "numpy.save"})
# Library calls that download or unpack data every process then reads (main process only, then a
# barrier); `.extractall(...)` (tarfile, zipfile) is recognised as a method.
_FETCHERS = frozenset({"urllib.request.urlretrieve", "shutil.unpack_archive"})
_FETCH_METHODS = frozenset({"extractall"})
# Methods that write to the path they are given: pandas' writers, and `save_pretrained` (a
# transformers model, tokenizer or config writing its folder).
_WRITE_METHODS = frozenset({"to_csv", "to_json", "to_parquet", "to_pickle", "save_pretrained"})
# Console output that is not `print`: a status line written on every process would repeat N times.
_CONSOLE = frozenset({"sys.stdout.write"})
# Writers recognised by their qualified name (and `torch.save`, a checkpoint or a cache).
_KNOWN_WRITES = _FILE_WRITERS | _FETCHERS | _CONSOLE | {"torch.save"}
# Where the written path sits among a writer's arguments: (position, keyword).
_PATH_ARG = {
    "torchvision.utils.save_image": (1, "fp"),
    "matplotlib.pyplot.savefig": (0, "fname"),
    "numpy.save": (0, "file"),
    "open": (0, "file"),
    "torch.save": (1, "f"),
    "to_csv": (0, "path_or_buf"),
    "to_json": (0, "path_or_buf"),
    "to_parquet": (0, "path"),
    "PIL.Image.Image.save": (0, "fp"),
    "to_pickle": (0, "path"),
    "save_pretrained": (0, "save_directory"),
}
# Methods of a model that only read it (no forward): `model.parameters()` in a guarded write is fine.
_READS_MODEL_ONLY = frozenset({
    "state_dict", "parameters", "named_parameters", "buffers", "named_buffers", "modules",
    "named_modules", "children", "named_children", "save_pretrained",
})
# A call reading a file back: its function's last name.
_READS_BACK = re.compile(r"load|read|^open$", re.IGNORECASE)


@dataclass(eq=False)
class _Write:
    what: str  # "`plt.savefig(...)`", for messages
    call: cst.Call
    where: StmtRef
    fetch: bool  # a download or unpack every process then reads
    path: cst.BaseExpression | None
    removal: bool = False  # `os.remove(...)`: its unit may be a `for` or an `if`
    console: bool = False  # `sys.stdout.write(...)`: no file, output on the main process only
    helper: bool = False  # a function the migration cannot read, known by its name only


def _file_writes(roles: Roles, plan: EditPlan, scope: Scope) -> tuple[list[StmtRef], dict[cst.BaseStatement, cst.BaseStatement]]:
    """Run the script's own file writes (`save_image`, `plt.savefig`, `with open(path, "w")`, a
    `torch.save` of something else than the model, `df.to_csv(path)`, `np.save`), status lines
    (`sys.stdout.write`) and downloads (`.extractall(...)`, `urlretrieve`) on the main process
    only, or report them. Returns the statements guarded, and the barrier put after each guarded
    download (a removal or rename of what it unpacked, guarded later, takes the barrier after it)."""
    barriers: dict[cst.BaseStatement, cst.BaseStatement] = {}
    if type(scope.node) is cst.ClassDef:
        return [], barriers
    # Left as they are: writes already under a rank check (a second run sees our own `if`), and
    # `open(f"rank{rank}.json", "w")`: each process writes its own file.
    writes = [
        w for w in _find_writes(roles, plan, scope, roles.facts.module_scope)
        if not rank_guarded(_fetch_unit(w.where) if w.fetch else _unit(w.where))
        and not (w.path is not None and _per_process_path(scope, w.path))
    ]
    guarded: list[StmtRef] = []
    method = _unreachable_method(roles, scope)
    if not roles.can_reach(scope) or method is not None:
        # a status line where the accelerator cannot reach is left as a print there would be, and
        # so is a function the migration cannot read (its name is all it knows of it)
        writes = [w for w in writes if not w.console and not w.helper]
        if not writes or not nested_in(scope, roles.facts.module_scope):
            return guarded, barriers  # another module of a unit (a logger's files): not the script's own writes
        if method is None and outside_classes(roles, scope):
            _launcher_rank_writes(roles, plan, scope, writes)
            return guarded, barriers
        first = writes[0]
        kind = f", a method of {method}," if method is not None else ""
        plan.report(CODE, first.call, (
            f"{first.what} in `{scope.qualname}`{kind} which cannot reach the accelerator, runs on every process "
            "(each writes the same file at once): run it on the main process only "
            f"(`if accelerator.is_main_process:`, passing `accelerator` in){_read_elsewhere(roles, scope, first)}"),
            unconverted=True)
        return guarded, barriers
    done: set[cst.BaseStatement] = set()
    read_back: list[StmtRef] = []
    for write in writes:
        unit = _fetch_unit(write.where) if write.fetch else _unit(write.where)
        if unit.stmt in done:
            continue
        done.add(unit.stmt)
        if unit.stmt in plan.main_process_only or any(outer.stmt in plan.main_process_only for outer in unit.path):
            continue  # inside a statement already on the main process (`with open(p, "w") as f: yaml.dump(c, f)`)
        if _written_to_devnull(roles, plan, scope, write, unit):
            continue
        problem = _why_not_guarded(roles, scope, write, unit, reads=False)
        reader = _reads_back(roles, scope, unit, write.path) if problem is None and write.path is not None else None
        if reader is not None and not _barrier_fits(unit):
            problem = (f"`{reader}` reads the file back on every process (a process other than the main one "
                       "would read a file not yet written), and the write is under an `if` or `while` whose test "
                       "may differ between processes, where a barrier could hang: write it under "
                       "`if accelerator.is_main_process:` and call `accelerator.wait_for_everyone()` where "
                       "every process passes, before reading it")
        if problem is not None:
            plan.report(CODE, write.call, f"{write.what} runs on every process (each writes the same file at once) "
                        f"and cannot run on the main process only: {problem}", unconverted=True)
            continue
        if unit.stmt in plan.replace_stmt:
            continue
        plan.main_process_only.add(unit.stmt)
        plan.use_accelerator(scope)
        guarded.append(unit)
        if not write.fetch and write.path is not None:
            _cache_first(roles, plan, scope, unit, write.path)
        if write.fetch:
            barrier = cst.parse_statement("accelerator.wait_for_everyone()\n")
            plan.insert_after[unit.stmt] = [*plan.insert_after.get(unit.stmt, []), barrier]
            barriers[unit.stmt] = barrier
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only; the others wait for it "
                        "(`accelerator.wait_for_everyone()`) before reading what it wrote")
        elif reader is not None:
            read_back.append(unit)
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only; `{reader}` reads the file back on "
                        "every process, so they all wait for it (`accelerator.wait_for_everyone()`) first")
        elif write.console:
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only (a status line, like `print`)")
        else:
            plan.change(CODE, unit.stmt, f"{write.what} on the main process only")
            if write.helper:
                _unwrapped_arguments(roles, plan, scope, write.call)
            _unwrapped_receiver(roles, plan, scope, write.call)
            _report_share_written(roles, plan, scope, write)
    _barriers_after(plan, read_back, barriers)
    return guarded, barriers


_WRITE_MODES = re.compile(r"^[wax][bt]?$|^[bt][wax]$")


def _written_to_devnull(roles: Roles, plan: EditPlan, scope: Scope, write: _Write, unit: StmtRef) -> bool:
    """`with open(path, "w") as f:` around code every process must run (the prepared model's
    forward, sampling text after training; a collective): the block cannot go on the main process
    only, so every process runs it and the processes other than the main one write to the null
    device, `open(path if accelerator.is_main_process else os.devnull, "w")`. Only for the builtin
    `open` in the `with` header, in a plain write mode, of a file nothing in the scope reads back."""
    header, call = write.where.stmt, write.call  # the `with` whose header opens the file (in `unit`)
    if type(header) is not cst.With or write.path is None or write.fetch or write.removal or write.console:
        return False
    if type(call.func) is not cst.Name or call.func.value != "open" or roles.facts.aliases.qualify(call.func) \
            or not any(item.item is call for item in header.items):
        return False
    mode = call_argument(call, 1, "mode")
    if not (isinstance(mode, cst.SimpleString) and _WRITE_MODES.match(mode.evaluated_value)):
        return False
    if len(call.args) < 1 or call.args[0].keyword is not None or call.args[0].value is not write.path:
        return False
    if _hazard(roles, scope, unit.stmt, set()) is None or _reads_back(roles, scope, unit, write.path) is not None:
        return False
    names = roles.facts.aliases.local_names_for("os")
    if names:
        devnull = f"{'os' if 'os' in names else names[0]}.devnull"
    elif any("devnull" in each.bindings for each in roles.facts.scopes):
        return False  # the script's own `devnull`: the import would shadow it or be shadowed
    else:
        devnull = "devnull"
        plan.imports.add(("os", "devnull"))
    path = cst.Module([]).code_for_node(write.path)
    chosen = cst.parse_expression(f"({path}) if accelerator.is_main_process else {devnull}"
                                  if isinstance(write.path, (cst.IfExp, cst.Lambda, cst.BooleanOperation))
                                  else f"{path} if accelerator.is_main_process else {devnull}")
    plan.calls[call] = lambda updated: updated.with_changes(
        args=[updated.args[0].with_changes(value=chosen), *updated.args[1:]])
    plan.use_accelerator(scope)
    plan.change(CODE, call, (
        f"{write.what} is written by the main process only: the block also runs the prepared model (or a "
        "collective), which every process must run, so the others run it too and write to the null device"))
    return True


# The launcher's rank test, as `_launcher_rank_prints` of checkpoints_and_output.py writes it.
_LAUNCHER_RANK = '`if int(os.environ.get("RANK", "0")) == 0:`'


def outside_classes(roles: Roles, scope: Scope) -> bool:
    """The entry module's level, or a function of it with no class around it (not a method, nor a
    function nested in one): where the launcher's rank is the only main-process test at hand."""
    while scope is not roles.facts.module_scope:
        if not scope.is_function or scope.is_method or scope.parent is None:
            return False
        scope = scope.parent
    return True


def launcher_rank_test(roles: Roles, plan: EditPlan) -> cst.BaseExpression:
    """`int(os.environ.get("RANK", "0")) == 0`, spelled as the module's imports spell `os.environ`
    (`from os import environ` added when it imports neither)."""
    from migrate.rules.checkpoints_and_output import _environ_spelling  # it imports this module

    environ = _environ_spelling(roles.facts.module_scope.node)
    if environ is None:
        plan.imports.add(("os", "environ"))
        environ = "environ"
    return cst.parse_expression(f'int({environ}.get("RANK", "0")) == 0')


def _launcher_rank_writes(roles: Roles, plan: EditPlan, scope: Scope, writes: list[_Write]) -> None:
    """The script's own file writes where no Accelerator is in scope (at module level, or in a
    plain function that runs before or without the one that creates it: the `__main__` block's
    `except KeyboardInterrupt: torch.save(net.state_dict(), "INTERRUPTED.pth")` around
    `train_net(net)`) run under `if int(os.environ.get("RANK", "0")) == 0:`, the launcher's rank
    that `accelerator.is_main_process` is made from, as prints there do. Only when the write is
    the same on every process and nothing else needs it on the others; else reported, with
    advice that can be followed there."""
    made = roles.accelerator_scope
    creator = f"`{made.qualname}`" if made is not None and made is not roles.facts.module_scope else None
    movers = [c for c in scope.library_calls if c.qualified in _MOVERS | _REMOVERS]
    handed = _handed_to_accelerator(roles, scope)
    done: set[cst.BaseStatement] = set()
    for write in writes:
        unit = _unit(write.where)
        if unit.stmt in done:
            continue
        done.add(unit.stmt)
        problem: str | None = None
        if write.fetch:
            problem = ("the others would read what it fetches before it is whole, and no barrier can be put "
                       "where no Accelerator exists: " + (f"do it in {creator}, after the Accelerator is created, "
                       if creator else "") + "or fetch the data once before launching")
        elif _in_error_handler(unit):
            problem = ("it is in an `except` block, for an error one process may meet alone (the main process "
                       "may never get there): name the process's rank in the path, as in "
                       '`f"{path}.rank{os.environ.get(\'RANK\', \'0\')}"`, so that each process writes its own file')
        elif (mover := _moves_written(movers, write)) is not None:
            problem = (f"`{mover}(...)` then handles its file on every process, which the main process alone "
                       f"would have written: put the write and the renames, copies or removals of its file "
                       f"under {_LAUNCHER_RANK} together")
        else:
            problem = _why_not_guarded(roles, scope, write, unit, reads=False, guard=_LAUNCHER_RANK)
        if problem is None:
            returned = _returned_by_accelerator_function(roles, scope, unit.stmt)
            if returned is not None:
                name, callee = returned
                problem = (f"`{name}` is what `{callee}(...)` returns, which may be an object `prepare` wrapped "
                           "(DistributedDataParallel's state dict carries a `module.` prefix): write it in "
                           f"`{callee}`, which reaches the accelerator, and it is saved once, unwrapped")
        if problem is None:
            used = _runs_handed_model(unit.stmt, handed)
            if used is not None:
                problem = (f"the statement runs `{used}`, which {creator or 'the function that creates the Accelerator'} "
                           "prepares (a sharded model's forward gathers its parameters from every process): compute "
                           f"on every process and write under {_LAUNCHER_RANK}")
        if problem is None and write.path is not None:
            reader = _reads_back(roles, scope, unit, write.path)
            if reader is not None:
                problem = (f"`{reader}` reads the file back on every process (a process other than the main one "
                           "would read a file not yet written), and no barrier can be put where no Accelerator "
                           "exists: " + (f"write and read it in {creator}, after the Accelerator is created"
                                         if creator else "write and read it where the accelerator reaches"))
        if problem is not None:
            plan.report(CODE, write.call, f"{write.what} in `{scope.qualname}`, which cannot reach the accelerator, "
                        f"runs on every process (each writes the same file at once): {problem}", unconverted=True)
            continue
        if unit.stmt in plan.replace_stmt or unit.stmt in plan.main_process_only:
            continue
        plan.launcher_rank_only[unit.stmt] = launcher_rank_test(roles, plan)
        plan.change(CODE, unit.stmt, (
            f"{write.what} runs where no Accelerator exists: on the launcher's rank 0 only (`RANK`, which "
            "`accelerator.is_main_process` is made from)"))


def _moves_written(movers: list[LibraryCall], write: _Write) -> str | None:
    """A rename, copy or removal after the write of the file it wrote (the same path expression, or
    any when the write's path is not known)."""
    empty = cst.Module([])
    text = empty.code_for_node(write.path) if write.path is not None else None
    for mover in movers:
        if mover.where.order < write.where.order:
            continue
        if text is None or any(empty.code_for_node(arg.value) == text for arg in mover.call.args):
            return mover.qualified
    return None


def _in_error_handler(unit: StmtRef) -> bool:
    """The statement runs in an `except` block for something other than `KeyboardInterrupt` (which
    the launcher passes on to every process: torchrun sends each worker the SIGINT it gets)."""
    for ref in unit.path:
        if type(ref.stmt) not in (cst.Try, cst.TryStar):
            continue
        for handler in ref.stmt.handlers:  # type: ignore[union-attr]
            body = handler.body
            if not (any(s is unit.stmt for s in body.body) or any(r.stmt is s for r in unit.path for s in body.body)):
                continue
            caught = handler.type
            names = caught.elements if type(caught) is cst.Tuple else [caught] if caught is not None else []
            values = [e.value if isinstance(e, cst.BaseElement) else e for e in names]
            if not values or not all(type(v) is cst.Name and v.value == "KeyboardInterrupt" for v in values):
                return True
    return False


def _handed_to_accelerator(roles: Roles, scope: Scope) -> set[str]:
    """Names this scope hands to the function that trains (`train_net(net=net)`) as a model it
    prepares: the argument of a parameter that is one of its models."""
    found: set[str] = set()
    home = roles.home
    if home is None or home.is_method:
        return found
    for site in scope.calls:
        if roles.facts.function_called(site.call) is not home:
            continue
        for index, param in enumerate(home.params):
            arg = call_argument(site.call, index, param) if param in roles.models else None
            if type(arg) is cst.Name:
                found.add(arg.value)
    return found


def _runs_handed_model(stmt: cst.BaseStatement, handed: set[str]) -> str | None:
    """A call in `stmt` of an object handed to the accelerator's function, other than reading its
    state (`net(x)`, `net.generate(...)`; not `net.state_dict()`)."""
    finder = _Calls()
    walk(stmt, finder)
    for call in finder.calls:
        func = call.func
        if type(func) is cst.Name and func.value in handed:
            return func.value
        if type(func) is cst.Attribute and func.attr.value not in _READS_MODEL_ONLY:
            owner = func.value
            if type(owner) is cst.Name and owner.value in handed:
                return owner.value
    return None


def _returned_by_accelerator_function(roles: Roles, scope: Scope, stmt: cst.BaseStatement) -> tuple[str, str] | None:
    """A model the statement saves (`x.state_dict()`, `x.module`, `x.save_pretrained(...)`, or
    `torch.save(x, ...)` whole) that this scope binds from a call of a function of the script that
    reaches the accelerator (`net = train_net(net)`): it may return the prepared object."""
    saved: list[str] = []
    finder = _Calls()
    walk(stmt, finder)
    for call in finder.calls:
        func = call.func
        if type(func) is cst.Attribute and func.attr.value in ("state_dict", "save_pretrained") \
                and type(func.value) is cst.Name:
            saved.append(func.value.value)
        elif type(func) is cst.Attribute and func.attr.value == "state_dict" and type(func.value) is cst.Attribute \
                and func.value.attr.value == "module" and type(func.value.value) is cst.Name:
            saved.append(func.value.value.value)
        elif roles.facts.aliases.qualify(func) == "torch.save" and call.args and type(call.args[0].value) is cst.Name:
            saved.append(call.args[0].value.value)  # type: ignore[attr-defined]
    for name in saved:
        for binding in scope.bindings.get(name, []):
            if type(binding.value) is not cst.Call:
                continue
            callee = roles.facts.function_called(binding.value)
            if callee is not None and roles.can_reach(callee):
                return name, callee.name
    return None


def _unwrapped_arguments(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call) -> None:
    """A prepared model handed to a saving function the migration cannot read
    (`save_checkpoint(epoch, encoder, decoder, ...)`) is handed unwrapped, and so are the state
    dicts it is handed (`save_checkpoint({"state_dict": model.state_dict()}, ...)`): it saves the
    module (the keys) the single-device script saved, not the DistributedDataParallel around it."""
    from migrate.rules.checkpoints_and_output import _unwrap_state_dicts  # it imports this module

    for arg in call.args:
        _unwrap_state_dicts(roles, plan, scope, arg.value)
    models = [arg.value for arg in call.args
              if not arg.star and (ref := reference(arg.value)) is not None and roles.all_in(scope, ref, roles.models)]
    if not models or call in plan.calls:
        return

    def unwrapped(updated: cst.Call) -> cst.Call:
        args = []
        for original, arg in zip(call.args, updated.args):
            if any(original.value is m for m in models):
                arg = arg.with_changes(value=cst.Call(
                    func=cst.Attribute(cst.Name("accelerator"), cst.Name("unwrap_model")), args=[cst.Arg(arg.value)]))
            args.append(arg)
        return updated.with_changes(args=args)

    plan.calls[call] = unwrapped
    names = ", ".join(f"`{cst.Module([]).code_for_node(m)}`" for m in models)
    plan.change(CODE, call, f"{names} handed to it unwrapped: it saves the module the single-device script saved")


def _unwrapped_receiver(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call) -> None:
    """A prepared model that saves itself (`model.save_pretrained(path)`) saves unwrapped
    (`accelerator.unwrap_model(model).save_pretrained(path)`): the module, its config and its keys
    as the single-device script saved them, not the DistributedDataParallel around it (which has no
    such method under HF Accelerate)."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value not in _WRITE_METHODS or call in plan.calls:
        return
    ref = reference(func.value)
    if ref is None or not (ref in roles.models or roles.all_in(scope, ref, roles.models)):
        return

    def unwrapped(updated: cst.Call) -> cst.Call:
        assert type(updated.func) is cst.Attribute
        receiver = cst.Call(func=cst.Attribute(cst.Name("accelerator"), cst.Name("unwrap_model")),
                            args=[cst.Arg(updated.func.value)])
        return updated.with_changes(func=updated.func.with_changes(value=receiver))

    plan.calls[call] = unwrapped
    plan.change(CODE, call, f"`{ref}` saves itself unwrapped: the module the single-device script saved")


def _report_share_written(roles: Roles, plan: EditPlan, scope: Scope, write: _Write) -> None:
    """A file written per batch of a loop that does not train, over a loader `prepare` shards (the
    training loader, held on the instance and iterated again by `test()`): each process sees its
    share of the batches, so the main process alone writes only the files of its share (and without
    the guard the processes would write files numbered alike). Reported, as the guard alone cannot
    make it whole: the loop needs a loader of its own, left unprepared."""
    enclosing = {id(ref.stmt) for ref in write.where.path}
    for loop in scope.loops:
        if id(loop.node) not in enclosing or loop.source is None or roles.is_training_loop(loop):
            continue
        held = held_by_the_class(roles, scope, loop.source) if roles.home is not None else None
        sources = held if held else [loop.source]
        if not held and loop.source in scope.params and roles.home is not None:
            # a parameter (`def validate(model, loader)`): the loaders its callers pass, not a
            # loader of home that has the parameter's name (`validate(model, val_loader)` while
            # home trains on `loader`)
            found = roles.origins(scope, loop.source)
            if found is not None:
                sources = [name for origin, name in found if origin is roles.home]
        # loaders prepared on entry to the training methods only: the instance keeps the user's
        prepared = [source for source in sources if source in roles.loaders and source not in roles.training_only_loaders]
        if not prepared:
            continue
        plan.report(CODE, write.call, (
            f"{write.what} runs on the main process only, once per batch of `{loop.source}`"
            + (f" (`{prepared[0]}`)" if prepared[0] != loop.source else "") + ", which is prepared "
            "for training and so gives each process its share of the batches: on N processes only the main "
            "process's share is written. Iterate a loader of its own here, left unprepared (each process then "
            "reads all of it and the main process writes every file)"), unconverted=True)
        return


_MAKE_FOLDER = frozenset({"os.makedirs", "os.mkdir"})
_IS_THERE = frozenset({"os.path.exists", "os.path.isdir"})


def _folders_made_once(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`if not os.path.exists(d): os.makedirs(d)` (or `os.mkdir(d)`, also `... and not
    os.path.isdir(d)`): N processes may all find the folder missing, and all but the first would
    then fail with FileExistsError. The call becomes `os.makedirs(d, exist_ok=True)`: on one
    process the test already made sure the folder is missing, so nothing else changes."""
    if type(scope.node) is cst.ClassDef or not nested_in(scope, roles.facts.module_scope):
        return
    empty = cst.Module([])
    for site in scope.library_calls:
        call, where = site.call, site.where
        if site.qualified not in _MAKE_FOLDER or not call.args or call.args[0].keyword is not None \
                or any(arg.keyword is not None and arg.keyword.value == "exist_ok" for arg in call.args):
            continue
        if site.qualified == "os.mkdir" and (type(call.func) is not cst.Attribute or len(call.args) != 1):
            continue  # `from os import mkdir`, or a mode given: left as it is
        outer = where.path[-1] if where.path else None
        if outer is None or type(outer.stmt) is not cst.If or where.block is not outer.stmt.body \
                or rank_guarded(where) or call in plan.calls:
            continue
        folder = empty.code_for_node(call.args[0].value)
        if not _tests_missing(roles, outer.stmt.test, folder):
            continue

        def made_once(updated: cst.Call) -> cst.Call:
            func = updated.func
            if type(func) is cst.Attribute and func.attr.value == "mkdir":
                func = func.with_changes(attr=cst.Name("makedirs"))
            args = list(updated.args)
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            exist_ok = cst.Arg(keyword=cst.Name("exist_ok"), value=cst.Name("True"),
                               equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            return updated.with_changes(func=func, args=[*args, exist_ok])

        plan.calls[call] = made_once
        plan.change(CODE, call, (
            f"`{site.qualified}({folder})` under a test that it is missing -> `os.makedirs({folder}, exist_ok=True)`: "
            "N processes may all find it missing, and all but the first would fail with FileExistsError"))


def _tests_missing(roles: Roles, test: cst.BaseExpression, folder: str) -> bool:
    """`not os.path.exists(folder)` / `not os.path.isdir(folder)`, alone or in an `and` chain."""
    if type(test) is cst.BooleanOperation and type(test.operator) is cst.And:
        return _tests_missing(roles, test.left, folder) or _tests_missing(roles, test.right, folder)
    if type(test) is not cst.UnaryOperation or type(test.operator) is not cst.Not:
        return False
    inner = test.expression
    while type(inner) is not cst.Call and inner.lpar:  # `not (os.path.exists(d))`
        inner = inner.with_changes(lpar=[], rpar=[])
    return (type(inner) is cst.Call and roles.facts.aliases.qualify(inner.func) in _IS_THERE and len(inner.args) == 1
            and cst.Module([]).code_for_node(inner.args[0].value) == folder)


def _barrier_fits(unit: StmtRef) -> bool:
    """A barrier right after `unit` is reached by every process alike: not under an `if` other than
    the `__main__` block, nor a `while` (their tests may read per-process values: a loss, a
    metric). A `for` loop runs as often on every process, as the training loop does."""
    empty = cst.Module([])
    return all(type(outer.stmt) not in (cst.If, cst.While) or (
        type(outer.stmt) is cst.If and "__name__" in empty.code_for_node(outer.stmt.test)) for outer in unit.path)


def _barriers_after(plan: EditPlan, units: list[StmtRef], barriers: dict[cst.BaseStatement, cst.BaseStatement]) -> None:
    """One `accelerator.wait_for_everyone()` after each run of neighbouring main-process statements
    that holds a file read back (`a.to_csv(p1); b.to_csv(p2)` share one `if` and one barrier)."""
    done: set[cst.BaseStatement] = set()
    for unit in units:
        body = list(unit.block.body)
        index = next(i for i, stmt in enumerate(body) if stmt is unit.stmt)
        while index + 1 < len(body) and body[index + 1] in plan.main_process_only \
                and body[index] not in plan.insert_after:
            index += 1
        last = body[index]
        if last in done or last in barriers:
            continue  # a download's barrier is there already
        done.add(last)
        plan.insert_after[last] = [*plan.insert_after.get(last, []),
                                   cst.parse_statement("accelerator.wait_for_everyone()\n")]


# Calls that remove files (`os.remove(path)`, `shutil.rmtree(folder)`): the path is the first argument.
_REMOVERS = frozenset({"os.remove", "os.unlink", "shutil.rmtree"})
# Calls that rename, move or copy files (`os.rename(extracted, data_file)`, `shutil.copyfile(path,
# best_path)`): part of the file operation whose files they handle.
_MOVERS = frozenset({"os.rename", "os.replace", "shutil.move", "shutil.copy", "shutil.copyfile", "shutil.copy2",
                     "shutil.copytree"})


def _removals(roles: Roles, plan: EditPlan, scope: Scope, saves: list[StmtRef], guarded: list[StmtRef],
              barriers: dict[cst.BaseStatement, cst.BaseStatement]) -> None:
    """File removals, renames and copies in the block of a checkpoint, a download or a file the
    main process alone now writes (the snapshot block: save, then remove the older snapshots; a
    best checkpoint copied; an unpacked file renamed) run on the main process only, with the
    `for`/`if`/`with` statements around them that hold nothing else; the save just before them joins
    the same `if`, and a download's barrier moves after them. A removal elsewhere in a function that
    writes from the main process is reported (a rename or copy elsewhere is left alone)."""
    removals = sorted((c for c in scope.library_calls if c.qualified in _REMOVERS | _MOVERS and c.call.args),
                      key=lambda c: c.where.order)
    if not removals or not (saves or guarded):
        return
    anchors = [*saves, *guarded]
    for removal in removals:
        unit = _removal_unit(removal.where)
        path = removal.call.args[0].value
        if rank_guarded(unit) or _per_process_path(scope, path) or unit.stmt in plan.main_process_only:
            continue
        what = f"`{removal.qualified}(...)`"
        moves = removal.qualified in _MOVERS
        if not any(anchor.block is unit.block for anchor in anchors):
            if not moves:
                plan.report(CODE, removal.call, (
                    f"{what} runs on every process, in a function whose checkpoints or files the main process "
                    "alone now writes: N processes removing the same files race (FileNotFoundError); run it "
                    "under `if accelerator.is_main_process:` if it removes those files"), unconverted=True)
            continue
        problem = _why_not_guarded(roles, scope, _Write(what, removal.call, removal.where, False, None, True), unit)
        if problem is not None:
            race = "renaming or copying the same files race" if moves else "removing the same files race"
            plan.report(CODE, removal.call, (
                f"{what} runs on every process (N processes {race}: FileNotFoundError) "
                f"and cannot run on the main process only: {problem}"), unconverted=True)
            continue
        if unit.stmt in plan.replace_stmt:
            continue
        plan.main_process_only.add(unit.stmt)
        plan.use_accelerator(scope)
        body = list(unit.block.body)
        index = next(i for i, stmt in enumerate(body) if stmt is unit.stmt)
        moved = _move_barrier(roles, scope, plan, barriers, body, index)
        if moves:
            plan.change(CODE, unit.stmt, f"{what} on the main process only, which alone writes the files it handles"
                        + ("; the others wait for it after" if moved else ""))
        else:
            plan.change(CODE, unit.stmt, f"{what} on the main process only, which alone writes the files it removes"
                        + ("; the others wait for it after" if moved else ""))
        # The save right before it (`accelerator.save(...)`, main process only already) joins its `if`.
        for save in saves:
            if index and save.block is unit.block and save.stmt is body[index - 1] \
                    and type(save.stmt) is cst.SimpleStatementLine and save.stmt not in plan.replace_stmt \
                    and _why_not_guarded(roles, scope, _Write("", removal.call, save, False, None), save) is None:
                plan.main_process_only.add(save.stmt)


def _move_barrier(roles: Roles, scope: Scope, plan: EditPlan, barriers: dict[cst.BaseStatement, cst.BaseStatement],
                  body: list[cst.BaseStatement], index: int) -> bool:
    """A download earlier in the block (`extractall(...)`, then `os.rename(extracted, data_file)`):
    its barrier moves after the rename, so the others wait for the whole file operation. Not when a
    statement between them reads a file (it would then read before the main process is done)."""
    for before in range(index - 1, -1, -1):
        barrier = barriers.get(body[before])
        if barrier is None:
            continue
        for between in body[before + 1:index]:
            if _reads_files(roles, scope, between):
                return False
        kept = [s for s in plan.insert_after.get(body[before], []) if s is not barrier]
        if kept:
            plan.insert_after[body[before]] = kept
        else:
            del plan.insert_after[body[before]]
        plan.insert_after[body[index]] = [*plan.insert_after.get(body[index], []), barrier]
        del barriers[body[before]]
        barriers[body[index]] = barrier
        return True
    return False


def _reads_files(roles: Roles, scope: Scope, stmt: cst.BaseStatement) -> bool:
    """`stmt` calls something that may read a file: `*load*`, `*read*`, `open`, or the script's own code."""
    finder = _Calls()
    walk(stmt, finder)
    return any(_READS_BACK.search((dotted_name(c.func) or "").rsplit(".", 1)[-1]) or _script_code(roles, scope, c)
               for c in finder.calls)


def _removal_unit(where: StmtRef) -> StmtRef:
    """The statement to guard for a removal: the one holding the call, with the `for`, `if` (without
    `else`) and `with` statements around it that hold nothing else (`for f in glob.glob(prefix +
    "*"): if f != path: os.remove(f)`). Not the `__main__` block nor a rank check."""
    unit = where
    empty = cst.Module([])
    while unit.path:
        outer = unit.path[-1]
        stmt = outer.stmt
        if type(stmt) not in (cst.For, cst.If, cst.With) or type(stmt.body) is not cst.IndentedBlock:
            break
        if len(stmt.body.body) != 1 or stmt.body.body[0] is not unit.stmt:
            break
        if type(stmt) in (cst.For, cst.If) and stmt.orelse is not None:
            break
        if type(stmt) is cst.If and ("__name__" in empty.code_for_node(stmt.test)
                                     or _RANK_TEST.search(empty.code_for_node(stmt.test))):
            break
        unit = outer
    return unit


_EXISTS = frozenset({"os.path.isfile", "os.path.exists"})


def _cache_first(roles: Roles, plan: EditPlan, scope: Scope, unit: StmtRef, path: cst.BaseExpression) -> None:
    """A cache (`if os.path.isfile(cache): v = torch.load(cache) else: v = compute(); torch.save(v,
    cache)`): the whole `if` runs under `with accelerator.main_process_first():`, so the main process
    computes (or downloads) and writes it, and the others then find the file and load it instead
    of computing it again (or reading it half written). Outside loops and rank checks, without a
    collective or a model call in the `if`."""
    empty = cst.Module([])
    text = empty.code_for_node(path)
    chain = [*unit.path, unit]
    for outer, inner in zip(reversed(chain[:-1]), reversed(chain[1:])):
        node = outer.stmt
        if type(node) is not cst.If:
            continue
        if outer.in_loop or rank_guarded(outer) or _goes_first(outer) or type(node.orelse) is not cst.Else:
            return
        test = node.test
        negated = type(test) is cst.UnaryOperation and type(test.operator) is cst.Not
        if negated:
            assert type(test) is cst.UnaryOperation
            test = test.expression
        if not (type(test) is cst.Call and roles.facts.aliases.qualify(test.func) in _EXISTS and test.args
                and empty.code_for_node(test.args[0].value) == text):
            continue
        written_in = node.body if negated else node.orelse.body
        if inner.block is not written_in:
            return
        if node in plan.main_process_first or node in plan.replace_stmt or _hazard(roles, scope, node, set()):
            return
        plan.main_process_first.add(node)
        plan.change(CODE, node, (
            "the cache is made under `with accelerator.main_process_first():`: the main process computes and "
            "writes it, the others then load it"))
        return




def _goes_first(where: StmtRef) -> bool:
    """Inside a `with` that already lets one process go first (`accelerator.main_process_first()`,
    a script's own `torch_distributed_zero_first(rank)`)."""
    empty = cst.Module([])
    return any(
        type(outer.stmt) is cst.With
        and any(_FIRST_CONTEXT.search(empty.code_for_node(item.item)) for item in outer.stmt.items)
        for outer in where.path
    )


_FIRST_CONTEXT = re.compile(r"_first\b|main_process|rank|master|primary", re.IGNORECASE)


def _per_process_path(scope: Scope, path: cst.BaseExpression) -> bool:
    """The path names the process's rank (`f"rank{rank}.json"`, `args.local_rank`,
    `accelerator.process_index`), directly or through a name bound to such a value in this scope:
    each process writes a file of its own."""
    values = [path]
    if type(path) is cst.Name:
        values.extend(b.value for b in scope.bindings.get(path.value, []) if b.value is not None)
    return any(_mentions_rank(value) for value in values)


def _mentions_rank(node: cst.CSTNode) -> bool:
    finder = _RankReads()
    walk(node, finder)
    return finder.found


class _RankReads(Visitor):
    """A rank read by name (`rank`, `args.local_rank`, `get_rank()`, `accelerator.is_main_process`),
    or by key: `results["rank"]`, `os.environ["RANK"]`, `os.environ.get("LOCAL_RANK")`,
    `os.getenv("RANK")`."""

    found = False

    def visit_Name(self, node: cst.Name) -> None:
        # `path if accelerator.is_main_process else os.devnull`: the main process's file only
        self.found = self.found or bool(_RANK_NAME.search(node.value) or _MAIN_NAME.match(node.value))

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
            self.found = self.found or _rank_key(node.slice[0].slice.value)

    def visit_Call(self, node: cst.Call) -> None:
        name = node.func.attr.value if type(node.func) is cst.Attribute else getattr(node.func, "value", None)
        if name in ("get", "getenv") and node.args:
            self.found = self.found or _rank_key(node.args[0].value)


_MAIN_NAME = re.compile(r"^is_(local_)?main_process$")


def _rank_key(key: cst.BaseExpression) -> bool:
    value = key.evaluated_value if type(key) is cst.SimpleString else None
    return isinstance(value, str) and bool(_RANK_NAME.search(value))


# Functions the migration cannot read (of a module it does not have: `from utils import
# save_checkpoint`, a star import, a package), known by their name alone: the last name, split at
# `_`, says it saves or writes files (`save_checkpoint`, `save_config_file`, `write_results`,
# `dump_predictions`, and a private helper's `_save_checkpoint`), downloads (`download_and_load_gpt2`, `maybe_download`, `fetch_data`,
# `hf_hub_download`) or draws a progress bar (`progress_bar`).
_SAVES_BY_NAME = re.compile(r"^_*(save|write|dump)(_|$)", re.IGNORECASE)
_UPLOADS_BY_NAME = re.compile(r"^_*(push|upload)(_|$)", re.IGNORECASE)  # `push_to_hub`, `upload_results`
_DOWNLOADS_BY_NAME = re.compile(r"(^|_)(download|fetch)", re.IGNORECASE)
_PROGRESS_BY_NAME = re.compile(r"(^|_)progress(_|$)", re.IGNORECASE)
# `utils.mkdir(path)`, `mkdir_if_missing(d)`, `make_dir(d)`, `ensure_dir(d)`: a helper that makes a
# folder, most often `if not os.path.exists(d): os.mkdir(d)`, where N processes may all find it
# missing and all but the first fail with FileExistsError
_MAKES_FOLDER_BY_NAME = re.compile(r"(^|_)(mkdirs?|makedirs?)(_|$)|^_*(make|create|ensure)_(dirs?|director(y|ies)|folders?)(_|$)",
                                   re.IGNORECASE)


def _unreadable_function(roles: Roles, scope: Scope, call: cst.Call) -> str | None:
    """The name of the function `call` runs when the migration cannot read it: imported from a
    module that is not the standard library's (`from utils import save_checkpoint`,
    `utils.save_checkpoint(...)`), or a name no statement of the file binds under a star import
    (`from utils import *`). None for the file's own functions (and those of the unit it reads),
    methods of objects, builtins and the standard library, and any name a function or class of the
    files read (the unit's modules) has."""
    if roles.facts.function_called(call) is not None:
        return None
    func = call.func
    last = (dotted_name(func) or "").rsplit(".", 1)[-1]
    if any(s.name == last and (s.is_function or type(s.node) is cst.ClassDef) for s in roles.facts.scopes):
        return None  # a function (or class) of that name in the files read: not known by its name only
    aliases = roles.facts.aliases
    qualified = aliases.qualify(func)
    if qualified is not None:
        root = qualified.split(".", 1)[0]
        if root in sys.stdlib_module_names or qualified == "torch.save":
            return None
        return qualified.rsplit(".", 1)[-1]
    if type(func) is not cst.Name or not aliases.star:
        return None
    name = func.value
    if hasattr(builtins, name) or name in roles.facts.classes:
        return None
    level: Scope | None = scope
    while level is not None:
        if level.binds(name):
            return None
        level = level.parent
    return name


def _helper_write(roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call, where: StmtRef) -> _Write | None:
    """A call of a function the migration cannot read whose name says it saves files, draws a
    progress bar, downloads, or makes a folder, as a statement of its own (its result unused: the others lack
    nothing; a download whose result is used runs under `main_process_first()` instead, see
    download_main_process_first.py)."""
    last = (roles.facts.aliases.qualify(call.func) or dotted_name(call.func) or "").rsplit(".", 1)[-1]
    if not (_SAVES_BY_NAME.search(last) or _PROGRESS_BY_NAME.search(last) or _DOWNLOADS_BY_NAME.search(last)
            or _UPLOADS_BY_NAME.search(last) or _MAKES_FOLDER_BY_NAME.search(last)):
        return None  # the cheap test first: most calls say nothing of files
    name = _unreadable_function(roles, scope, call)
    if name is None:
        return None
    if _SAVES_BY_NAME.search(name) and _alone(call, where):
        return _Write(f"`{name}(...)` (which the migration cannot read; its name says it saves files)", call, where,
                      False, None, helper=True)
    if _UPLOADS_BY_NAME.search(name) and _alone(call, where):
        return _Write(f"`{name}(...)` (which the migration cannot read; its name says it uploads files)", call, where,
                      False, None, helper=True)
    if _PROGRESS_BY_NAME.search(name) and _alone(call, where):
        return _Write(f"`{name}(...)` (which the migration cannot read; its name says it draws a progress bar)",
                      call, where, False, None, console=True, helper=True)
    if _DOWNLOADS_BY_NAME.search(name) and _alone(call, where) and not where.in_loop:
        return _Write(f"`{name}(...)` (which the migration cannot read; its name says it downloads)", call, where,
                      True, None, helper=True)
    if _MAKES_FOLDER_BY_NAME.search(name) and _alone(call, where) and _barrier_fits(where) \
            and not _group_set_up_later(roles, plan, scope, where):
        # made once, by the main process, before any process writes into it; not under an `if` or
        # `while` (every process must reach the barrier after it), nor above the script's own
        # process-group setup, below which the Accelerator is created (`utils.mkdir(args.output_dir)`
        # before `utils.init_distributed_mode(args)`): left as it is there
        return _Write(f"`{name}(...)` (which the migration cannot read; its name says it makes a folder)", call,
                      where, True, None, helper=True)
    return None


def _group_set_up_later(roles: Roles, plan: EditPlan, scope: Scope, where: StmtRef) -> bool:
    """A statement of `scope` at or after `where` sets up the process group (`init_process_group`,
    the script's `init_distributed_mode(args)`): the Accelerator is created after it (AM001), so
    nothing above it can use `accelerator`."""
    node = scope.node
    if type(node) is cst.Module:
        body = list(node.body)
    elif type(node) is cst.FunctionDef and isinstance(node.body, cst.IndentedBlock):
        body = list(node.body.body)
    else:
        return False
    top = where.path[0].stmt if where.path else where.stmt
    index = next((i for i, stmt in enumerate(body) if stmt is top), None)
    if index is None:
        return False
    initialisers = _group_initialisers(roles)
    return any(_initialises_group(roles, stmt, plan.create_at, initialisers) for stmt in body[index:])


def _alone(call: cst.Call, where: StmtRef) -> bool:
    """The call is a statement of its own: its result is not used."""
    stmt = where.stmt
    return (type(stmt) is cst.SimpleStatementLine and len(stmt.body) == 1 and type(stmt.body[0]) is cst.Expr
            and stmt.body[0].value is call)


def _find_writes(roles: Roles, plan: EditPlan, scope: Scope, module_scope: Scope) -> list[_Write]:
    found: list[_Write] = []
    seen: set[int] = set()
    for site in (*scope.library_calls, *scope.calls):
        if id(site.call) in seen:
            continue
        seen.add(id(site.call))
        if site.call in plan.calls or (type(site) is LibraryCall and site.qualified in _KNOWN_WRITES):
            continue
        helper = _helper_write(roles, plan, scope, site.call, site.where)
        if helper is not None:
            found.append(helper)
    for call in scope.library_calls:
        if call.qualified == "torch.save" and call.call.args and call.call not in plan.calls \
                and nested_in(scope, module_scope):
            # not a checkpoint of the model (those are `accelerator.save` now): a cache, an
            # optimizer's state
            found.append(_Write("`torch.save(...)`", call.call, call.where, False, _path_of(call.call, call.qualified)))
        elif call.qualified in _FILE_WRITERS:
            short = call.qualified.rsplit(".", 1)[-1]
            found.append(_Write(f"`{short}(...)`", call.call, call.where, False, _path_of(call.call, call.qualified)))
        elif call.qualified in _FETCHERS:
            short = call.qualified.rsplit(".", 1)[-1]
            found.append(_Write(f"`{short}(...)`", call.call, call.where, True, None))
        elif call.qualified in _CONSOLE:
            found.append(_Write(f"`{call.qualified}(...)`", call.call, call.where, False, None, console=True))
    found.extend(_image_saves(scope))
    for site in scope.method_calls:
        func = site.call.func
        assert type(func) is cst.Attribute
        if func.attr.value in _FETCH_METHODS:
            found.append(_Write(f"`.{func.attr.value}(...)`", site.call, site.where, True, None))
        elif func.attr.value in _WRITE_METHODS and site.call.args:
            found.append(_Write(f"`.{func.attr.value}(...)`", site.call, site.where, False,
                                _path_of(site.call, func.attr.value)))
    if not scope.binds("open"):
        for site in scope.calls:
            if site.callee == "open" and _writes_mode(site.call):
                mode = _mode(site.call)
                found.append(_Write(f"`open(..., {mode})`", site.call, site.where, False, _path_of(site.call, "open")))
    found = [w for w in found if not in_memory(roles, scope, w.path)]
    return sorted(found, key=lambda w: w.where.order)


_BUFFERS = frozenset({"io.BytesIO", "io.StringIO"})


def in_memory(roles: Roles, scope: Scope, target: cst.BaseExpression | None) -> bool:
    """`target` is a buffer in this process's memory (`buffer = io.BytesIO()`, every binding of the
    name in `scope`), not a file: what is written there is read back by the code after it (an
    upload, a hash), so every process writes its own; guarded, the others would go on with an
    empty buffer."""
    if type(target) is not cst.Name:
        return False
    bindings = scope.bindings.get(target.value, [])
    return bool(bindings) and all(
        type(b.value) is cst.Call and roles.facts.aliases.qualify(b.value.func) in _BUFFERS for b in bindings)


def _image_saves(scope: Scope) -> list[_Write]:
    """`Image.fromarray(array).save(path)`, or `img = Image.open(p)` / `Image.fromarray(a)` (also
    through a method chain, `.convert("RGB")`) and then `img.save(path)` in the same scope: a PIL
    image written to a file (a sample, a predicted mask), known from the PIL call that made the
    image, not from the method's name."""
    made = {id(call.call): call for call in scope.library_calls if call.qualified.startswith("PIL.Image.")}
    if not made:
        return []
    images: set[str] = set()  # names bound in this scope from a PIL.Image call, and only so
    other: set[str] = set()
    found: list[_Write] = []

    def from_pil(expr: cst.BaseExpression) -> bool:
        """`Image.fromarray(a)`, or a method chain on it (`Image.open(p).convert("RGB").resize(s)`)."""
        while isinstance(expr, cst.Call):
            if id(expr) in made:
                return True
            if not isinstance(expr.func, cst.Attribute):
                return False
            expr = expr.func.value
        return False

    class Saves(Visitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is scope.node  # a nested function is a scope of its own

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return node is scope.node

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            return False

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if type(target.target) is cst.Name:
                    (images if from_pil(node.value) else other).add(target.target.value)

        def visit_Call(self, node: cst.Call) -> None:
            func = node.func
            if type(func) is cst.Attribute and func.attr.value == "save" and node.args and from_pil(func.value):
                found.append(_Write("`Image.save(...)`", node, _made_in(made, func.value).where, False,
                                    _path_of(node, "PIL.Image.Image.save")))

    walk(scope.node, Saves())
    images -= other
    for site in scope.method_calls:
        func = site.call.func
        if type(func) is cst.Attribute and func.attr.value == "save" and site.call.args \
                and type(site.receiver) is cst.Name and site.receiver.value in images:
            found.append(_Write("`Image.save(...)`", site.call, site.where, False,
                                _path_of(site.call, "PIL.Image.Image.save")))
    return found


def _made_in(made: dict[int, LibraryCall], expr: cst.BaseExpression) -> LibraryCall:
    """The PIL call at the root of a method chain that `from_pil` accepted."""
    while id(expr) not in made:
        assert isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
        expr = expr.func.value
    return made[id(expr)]


def _mode(call: cst.Call) -> str | None:
    """The mode of `open(path, mode)` as written (`'w'`), when it is given."""
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "mode" or (keyword is None and index == 1 and not arg.star):
            return cst.Module([]).code_for_node(arg.value)
    return None


def _writes_mode(call: cst.Call) -> bool:
    """`open(path, "w")` (also "a", "x", "wb", `mode="w"`): a mode given as a literal that writes."""
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "mode" or (keyword is None and index == 1 and not arg.star):
            value = arg.value
            return (type(value) is cst.SimpleString and isinstance(value.evaluated_value, str)
                    and bool(set(value.evaluated_value) & set("wax")))
    return False


def _path_of(call: cst.Call, qualified: str) -> cst.BaseExpression | None:
    position, keyword = _PATH_ARG[qualified]
    for index, arg in enumerate(call.args):
        if (arg.keyword is None and not arg.star and index == position) or (
                arg.keyword is not None and arg.keyword.value == keyword):
            return arg.value
    return None


def _unit(where: StmtRef) -> StmtRef:
    """The statement to guard: the one holding the call, or the `with` blocks around it that hold
    nothing else (`with requests.get(url) as r: with tarfile.open(fileobj=r.raw) as t:
    t.extractall()` downloads once, not only unpacks once)."""
    unit = where
    while unit.path:
        outer = unit.path[-1]
        if type(outer.stmt) is not cst.With or type(outer.stmt.body) is not cst.IndentedBlock:
            break
        if len(outer.stmt.body.body) != 1 or outer.stmt.body.body[0] is not unit.stmt:
            break
        unit = outer
    return unit


def _fetch_unit(where: StmtRef) -> StmtRef:
    """For a download or unpack: the statement with the `with` and `if` statements around it
    (`if not os.path.exists(archive): urlretrieve(url, archive)`), so that only the main process
    tests and fetches, and the barrier after it is outside any test a process could see otherwise
    (another process would find the archive the main process is writing, skip a barrier inside the
    `if`, and the processes' barriers would no longer pair). Not above a loop, nor the
    `if __name__ == "__main__":` block."""
    unit = where
    empty = cst.Module([])
    while unit.path:
        outer = unit.path[-1]
        if type(outer.stmt) is cst.If and (
                "__name__" in empty.code_for_node(outer.stmt.test) or _RANK_TEST.search(empty.code_for_node(outer.stmt.test))):
            break  # the `__main__` block, or a rank check (ours, on a second run): stays around it
        if type(outer.stmt) not in (cst.With, cst.If) or not any(s is outer.stmt for s in outer.block.body):
            break
        unit = outer
    return unit


def _why_not_guarded(roles: Roles, scope: Scope, write: _Write, unit: StmtRef, reads: bool = True,
                     guard: str = "`if accelerator.is_main_process:`") -> str | None:
    """Why the statement cannot run on the main process only (None: it can); `reads=False` leaves
    out the file being read back (the caller puts a barrier before the reads instead). `guard`: the
    main-process test the advice names (the launcher's rank where no Accelerator is in scope)."""
    stmt = unit.stmt
    if type(stmt) not in (cst.SimpleStatementLine, cst.With) and not ((write.fetch or write.removal) and type(stmt) is cst.If) \
            and not (write.removal and type(stmt) is cst.For):
        return ("the call is part of the header of a compound statement; write the file in a statement of "
                f"its own under {guard}")
    hazard = _hazard(roles, scope, stmt, set())
    if hazard is not None and write.removal:
        return (f"the statement also {hazard}, which may wait for the other processes (a collective; a "
                "distributed model's forward may synchronise buffers), so every process must run it: keep "
                "that on every process and remove the files in a statement of its own under "
                "`if accelerator.is_main_process:`")
    if hazard is not None:
        return (f"the statement also {hazard}, which may wait for the other processes (a collective; "
                "DistributedDataParallel's forward broadcasts the model's buffers after a training step, even "
                "under `torch.no_grad()`), so every process must run it: keep "
                "that on every process and write from the main process only (compute first, then "
                + (f"{guard} around the write)" if guard != "`if accelerator.is_main_process:`" else
                   "`if accelerator.is_main_process:` around the write, or "
                   "`open(path if accelerator.is_main_process else os.devnull, ...)`)"))
    bound = _bound_and_read_elsewhere(scope, stmt)
    if bound is not None:
        return (f"it binds `{bound}`, which other statements read on every process; bind it on every "
                f"process and write the file under {guard}")
    if reads and write.path is not None:
        reader = _reads_back(roles, scope, unit, write.path)
        if reader is not None:
            return (f"`{reader}` reads the file back on every process (a process other than the main one "
                    "would read a file not yet written): write it under `if accelerator.is_main_process:` "
                    "and call `accelerator.wait_for_everyone()` before reading it")
    return None


def _hazard(roles: Roles, scope: Scope, node: cst.CSTNode, seen: set[int]) -> str | None:
    """What in `node` every process must run: a call of a prepared model (a distributed model's
    forward may synchronise buffers), an `accelerator` method or `torch.distributed` call (a
    collective), a backward or optimizer step, or such a thing in a function of this file it calls."""
    finder = _Calls()
    walk(node, finder)
    aliases = roles.facts.aliases
    for call in finder.calls:
        func = call.func
        target = reference(func)
        if target is None and type(func) is cst.Attribute and func.attr.value not in _READS_MODEL_ONLY:
            owner = func.value
            if type(owner) is cst.Attribute and owner.attr.value == "module":
                owner = owner.value  # `model.module.decode(...)`
            target = reference(owner)  # `model.generate(...)`, `accelerator.gather(...)`
        if target is not None and (target in roles.models or roles.all_in(scope, target, roles.models)):
            return f"runs the prepared model `{target}`"
        if target in ("accelerator", "self.accelerator") and type(func) is cst.Attribute \
                and func.attr.value not in ("print", "save"):
            return f"calls `{target}.{func.attr.value}`"
        qualified = aliases.qualify(func) or ""
        if qualified.startswith("torch.distributed."):
            return f"calls `{qualified}`"
        if type(func) is cst.Attribute and func.attr.value in ("backward", "step"):
            return f"calls `.{func.attr.value}()`"
        callee = roles.facts.function_called(call)
        if callee is not None and id(callee) not in seen:
            seen.add(id(callee))
            inner = _hazard(roles, callee, callee.node, seen)
            if inner is not None:
                return f"calls `{callee.qualname}`, which {inner}"
    return None


class _Calls(Visitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


class _Names(Visitor):
    """Names bound in a statement, and every name read."""

    def __init__(self) -> None:
        self.bound: list[str] = []
        self.read: list[cst.Name] = []

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.bound.extend(target_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.bound.extend(target_names(node.name))

    def visit_For(self, node: cst.For) -> None:
        self.bound.extend(target_names(node.target))

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self.bound.extend(target_names(node.target))

    def visit_Name(self, node: cst.Name) -> None:
        self.read.append(node)


def _bound_and_read_elsewhere(scope: Scope, stmt: cst.BaseStatement) -> str | None:
    """A name the statement binds that a statement outside it reads (on the other processes it
    would never be bound). Reads inside another `with ... as <name>` that binds it anew do not count
    (`with open(a, "w") as f:` then `with open(b, "w") as f:`)."""
    inside = _Names()
    walk(stmt, inside)
    bound = set(inside.bound)
    if not bound:
        return None
    own = {id(n) for n in inside.read}

    class Reads(Visitor):
        found: str | None = None
        shadowed: list[set[str]] = []

        def visit_With(self, node: cst.With) -> bool:
            if node is stmt:
                return False
            names = {n for item in node.items if item.asname is not None for n in target_names(item.asname.name)}
            self.shadowed.append(names)
            return True

        def leave_With(self, node: cst.With) -> None:
            if node is not stmt:
                self.shadowed.pop()

        def visit_For(self, node: cst.For) -> bool:
            # `for f in ...:` binds `f` anew: reads in its body are of that binding
            self.shadowed.append(set(target_names(node.target)) if node is not stmt else set())
            return True

        def leave_For(self, node: cst.For) -> None:
            self.shadowed.pop()

        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return node is not stmt

        def visit_Name(self, node: cst.Name) -> None:
            if self.found is None and node.value in bound and id(node) not in own \
                    and not any(node.value in names for names in self.shadowed):
                self.found = node.value

    reads = Reads()
    reads.shadowed = []
    walk(scope.node, reads)
    return reads.found


def _reads_back(roles: Roles, scope: Scope, unit: StmtRef, path: cst.BaseExpression) -> str | None:
    """A call outside the statement, in the same scope, that reads a file at the same path
    expression (`torch.load`, `np.load`, `Image.open`, `open(path)`, `pd.read_csv(path)`, or a
    class or function of the script given the path: `CsvDataset(csv_file=path)`): the written
    file read back.
    Not a read in the other branch of an `if` around the write outside any loop (`if
    os.path.isfile(cache): v = torch.load(cache) else: ...; torch.save(v, cache)`): a process
    that writes never reads it in this run."""
    stmt = unit.stmt
    empty = cst.Module([])
    text = empty.code_for_node(path)
    found: list[str] = []
    # `if` statements around the write (outside loops) -> the branch holding it
    branches: dict[int, cst.CSTNode] = {}
    chain = [*unit.path, unit]
    for outer, inner in zip(chain, chain[1:]):
        node = outer.stmt
        if type(node) is not cst.If or outer.in_loop:
            continue
        if inner.block is node.body:
            branches[id(node)] = node.body
        elif type(node.orelse) is cst.Else and inner.block is node.orelse.body:
            branches[id(node)] = node.orelse

    class Reads(Visitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            return node is not stmt

        def visit_With(self, node: cst.With) -> bool:
            return node is not stmt

        def visit_If(self, node: cst.If) -> bool:
            branch = branches.get(id(node))
            if branch is None:
                return True
            walk(node.test, self)
            walk(branch, self)
            return False

        def visit_Call(self, node: cst.Call) -> None:
            name = dotted_name(node.func) or ""
            if found or not (_READS_BACK.search(name.rsplit(".", 1)[-1]) or _script_code(roles, scope, node)):
                return
            if name == "open" and _writes_mode(node):
                return  # `open(log_file, "a")` after `open(log_file, "w")`: written again, not read
            if any(empty.code_for_node(arg.value) == text for arg in node.args):
                found.append(name)

    walk(scope.node, Reads())
    return found[0] if found else None


def _read_elsewhere(roles: Roles, scope: Scope, write: _Write) -> str:
    """For the report of a write the accelerator cannot reach: where another function of the file
    reads the same path back (an early-stopping class saving `checkpoint.pt`, the training function
    loading it after its loop), the barrier that following the report also needs; else ""."""
    if write.path is None or write.fetch:
        return ""
    unit = _unit(write.where)
    module = roles.facts.module_scope
    for other in [*(s for s in roles.facts.scopes if s is not module), module]:
        if other is scope or type(other.node) is cst.ClassDef:
            continue
        reader = _reads_back(roles, other, unit, write.path)
        if reader is not None:
            return (f"; `{reader}` in `{other.qualname}` reads the file back on every process: call "
                    "`accelerator.wait_for_everyone()` before it, where every process passes, so that no process "
                    "reads the file while the main process writes it")
    return ""


def _script_code(roles: Roles, scope: Scope, call: cst.Call) -> bool:
    """`call` runs a function or builds a class of the script's own (`SpamDataset(csv_file=p)`):
    handed the path just written, it reads it (a writer of the script's own is a write, found as one)."""
    if roles.facts.function_called(call) is not None:
        return True
    name = call.func.value if type(call.func) is cst.Name else None
    if name is None or name not in roles.facts.classes:
        return False
    # at module level the class statement is the name's binding; in a function, a local binding shadows it
    return scope is roles.facts.module_scope or not scope.binds(name)
