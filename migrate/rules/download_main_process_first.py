"""Downloading datasets built by the main process first (part of checkpoints-and-output, AM009).

A dataset built with `download=` (`datasets.MNIST(root, download=True)`, the script's own class
taking it, also inside `DataLoader(...)`) and torchtext's legacy data sets that download when
missing (`.splits`, `.iters`) are built under `with accelerator.main_process_first():`, where the
accelerator is at hand, else where the function building them is called; otherwise reported. The
AM009 docstring, in `checkpoints_and_output.py`, documents the behaviour.
"""

from __future__ import annotations

import re

import libcst as cst

from migrate.analysis import Scope, StmtRef
from migrate.edits import EditPlan
from migrate.names import dotted_name
from migrate.roles import Roles
from migrate.rules.guard_file_operations import (
    _DOWNLOADS_BY_NAME,
    CODE,
    _alone,
    _goes_first,
    _hazard,
    rank_guarded,
    _unreachable_method,
    _unreadable_function,
)
from migrate.walk import walk

# Implicit downloads: torchtext's legacy data sets fetch and unpack their files when missing.
_IMPLICIT_DOWNLOAD = re.compile(r"^torchtext\.(legacy\.)?datasets\.\w+\.(splits|iters)$")


def _implicit_downloads(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """`datasets.SNLI.splits(text, label)` (torchtext's legacy API downloads the data set when it
    is missing): under `with accelerator.main_process_first():` where the accelerator is at hand,
    else reported."""
    for site in scope.library_calls:
        if not _IMPLICIT_DOWNLOAD.match(site.qualified) or rank_guarded(site.where) or _goes_first(site.where):
            continue
        what = f"`{cst.Module([]).code_for_node(site.call.func)}(...)` downloads the data set when it is missing"
        if roles.can_reach(scope) and not roles.needs_parameter(scope) and _unreachable_method(roles, scope) is None:
            _first_on_main_process(roles, plan, scope, site.call, site.where.stmt, what)
        else:
            plan.report(CODE, site.call, (
                f"{what}, in `{scope.qualname}`, where the accelerator cannot reach: every process would download "
                "it into the same folder at once; build it under `with accelerator.main_process_first():` (or "
                "download it once before launching)"), unconverted=True)


def _unreadable_downloads(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """A call of a function the migration cannot read whose name says it downloads, its result used
    (`settings, params = download_and_load_gpt2(model_size, models_dir="gpt2")`): the statement runs
    under `with accelerator.main_process_first():`, where the accelerator is at hand (the main
    process downloads, the others then find the files and load them), else it is reported. Called
    as a statement of its own, it is a guarded download instead (main process, then a barrier)."""
    if type(scope.node) is cst.ClassDef:
        return
    seen: set[int] = set()
    for site in (*scope.library_calls, *scope.calls):
        call, where = site.call, site.where
        if id(call) in seen or _alone(call, where) or where.in_loop or type(where.stmt) is not cst.SimpleStatementLine:
            continue  # a download runs once, in a statement of its own (`for b in fetch_batches(...)`: data)
        seen.add(id(call))
        qualified = roles.facts.aliases.qualify(call.func) or dotted_name(call.func) or ""
        if not _DOWNLOADS_BY_NAME.search(qualified.rsplit(".", 1)[-1]):
            continue
        name = _unreadable_function(roles, scope, call)
        if name is None or not _DOWNLOADS_BY_NAME.search(name) or rank_guarded(where) or _goes_first(where):
            continue
        if _binds_loader(roles, where.stmt):
            continue  # `self.train_loader = fetch_loader(...)`: the training data, prepared, not a download
        what = f"`{name}(...)` (which the migration cannot read; its name says it downloads) returns what it fetched"
        if roles.can_reach(scope) and not roles.needs_parameter(scope) and _unreachable_method(roles, scope) is None:
            _first_on_main_process(roles, plan, scope, call, where.stmt, what)
        elif roles.facts.module_scope is scope or scope.is_function:
            plan.report(CODE, call, (
                f"{what}, in `{scope.qualname}`, where the accelerator cannot reach: every process would download "
                "into the same folder at once; call it under `with accelerator.main_process_first():` (or download "
                "once before launching)"), unconverted=True)


def _binds_loader(roles: Roles, stmt: cst.BaseStatement) -> bool:
    """The statement binds a loader the training loop iterates (its name says "fetch", its role
    says data): `loader = fetch_loader(...)`, `self.train_loader = fetch_loader(...)`, unpacked."""
    loaders = set(roles.loaders) | set(roles.unread_loaders)
    if not loaders or type(stmt) is not cst.SimpleStatementLine:
        return False
    small = stmt.body[0]
    targets = [t.target for t in small.targets] if type(small) is cst.Assign else []
    names: list[str] = []
    for target in targets:
        parts = target.elements if type(target) in (cst.Tuple, cst.List) else [target]
        names += [dotted_name(p.value if isinstance(p, cst.BaseElement) else p) or "" for p in parts]
    return any(n in loaders or n.rsplit(".", 1)[-1] in loaders for n in names if n)


_LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# Libraries whose functions make or read data already at hand (tensors, arrays, frames), never a download.
_IN_MEMORY = {"torch", "numpy", "pandas", "scipy", "sklearn"}


def _unread_datasets(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """A dataset a DataLoader wraps, built by a function the migration cannot read (`train_set =
    get_training_set(...)` of an absent `data.py`): such builders commonly download and unpack their
    files when missing, which every process would then do into the same folder at once (a
    `makedirs` without `exist_ok` fails on the others). The statement runs under `with
    accelerator.main_process_first():` where the accelerator is at hand; nothing else changes (the
    others wait for the main process, then build theirs from the files it left); so does
    `load_dataset(...)` (HF datasets downloads into its cache). Not a class (`ImageFolder(root)`: a
    library's dataset class downloads only when given `download=`, handled above), and not
    reported where the accelerator cannot reach: nothing says that this builder downloads. A method
    of an object made by an unread class (`factory = Factory(root)`, then `train_set =
    factory.get_dataset(name)`) is such a builder too: the class is only its holder."""
    if type(scope.node) is cst.ClassDef or not roles.can_reach(scope) or roles.needs_parameter(scope) \
            or _unreachable_method(roles, scope) is not None:
        return
    wrapped: set[str] = set()
    for site in scope.library_calls:
        if site.qualified not in _LOADERS:
            continue
        args = site.call.args
        data = next((a.value for a in args if a.keyword is not None and a.keyword.value == "dataset"), None)
        if data is None and args and args[0].keyword is None and not args[0].star:
            data = args[0].value
        if type(data) is cst.Name:
            wrapped.add(data.value)
    for name in sorted(wrapped):
        bindings = scope.bindings.get(name, [])
        if len(bindings) != 1:
            continue
        stmt = bindings[0].where.stmt
        if type(stmt) is not cst.SimpleStatementLine or len(stmt.body) != 1 or type(stmt.body[0]) is not cst.Assign:
            continue
        value = stmt.body[0].value
        if type(value) is not cst.Call or rank_guarded(bindings[0].where) or _goes_first(bindings[0].where):
            continue
        root = (roles.facts.aliases.qualify(value.func) or "").split(".", 1)[0]
        if root in _IN_MEMORY:
            continue  # `torch.randn(...)`, `torch.load(path)`, `np.load(path)`: data at hand, no download
        builder = _unreadable_function(roles, scope, value)
        if builder is None:
            builder = _unread_object_method(roles, scope, value)
        elif builder[:1].isupper():
            continue  # a class (`ImageFolder(root)`): a library's dataset downloads only with `download=`, above
        if builder is None:
            continue
        _first_on_main_process(roles, plan, scope, value, stmt, (
            f"`{name}` is built by `{builder}(...)`, which the migration cannot read and which may download its "
            "files when they are missing"))


def _unread_object_method(roles: Roles, scope: Scope, call: cst.Call) -> str | None:
    """`Factory(...).get_dataset` written `factory = Factory(root)` then `factory.get_dataset(name)`
    (`factory` bound once in the scope, `Factory` of a module the migration cannot read): the method
    builds the dataset, and may download it, as an unread builder function would."""
    func = call.func
    if type(func) is not cst.Attribute or type(func.value) is not cst.Name:
        return None
    owner = scope.bindings.get(func.value.value, [])
    if len(owner) != 1 or type(owner[0].value) is not cst.Call:
        return None
    made_by = _unreadable_function(roles, scope, owner[0].value)
    if made_by is None:
        return None
    return f"{made_by}(...).{func.attr.value}"


def _downloading_datasets(roles: Roles, plan: EditPlan, scope: Scope) -> None:
    """A dataset built with `download=` (`datasets.MNIST(root, download=True)`, the script's own
    class taking it, also inside `DataLoader(...)`): the statement runs under
    `with accelerator.main_process_first():` (neighbours share one `with`); in a function that does
    not hold the accelerator, the statements calling it do (`build_dataset(args)` of another module,
    a Dataset class's constructor); otherwise it is reported."""
    if type(scope.node) is cst.ClassDef:
        return
    seen: set[cst.Call] = set()
    found: list[tuple[cst.Call, StmtRef]] = []
    for site in (*scope.library_calls, *scope.calls, *scope.method_calls):
        if site.call not in seen and _downloads(scope, site.call):
            seen.add(site.call)
            found.append((site.call, site.where))
    for call, where in _super_calls(scope):
        if call not in seen and _downloads(scope, call):
            seen.add(call)
            found.append((call, where))
    for call, where in sorted(found, key=lambda f: f[1].order):
        if rank_guarded(where) or _goes_first(where):
            continue  # the script lets one process go first itself (or a second run)
        if not _first_where_called(roles, plan, scope, call, where, frozenset()):
            place = f"in `{scope.qualname}`, where the accelerator cannot reach"
            if scope is roles.facts.module_scope and roles.accelerator_scope is not None:
                place = f"at module level, before the Accelerator (created in `{roles.accelerator_scope.qualname}`) exists"
            plan.report(CODE, call, (
                f"this dataset is built with `download=` {place}, so every process downloads and unpacks it into the same folder at once: build it "
                "under `with accelerator.main_process_first():` (or download it once before launching)"), unconverted=True)


def _super_calls(scope: Scope) -> list[tuple[cst.Call, StmtRef]]:
    """`super().__init__(root, download=True)` in the constructor of the script's subclass of a
    library's dataset (`class Subset(SPEECHCOMMANDS)`): the call the analysis records is `super()`;
    this is the method called on it, which builds (and downloads) the data set."""
    found: list[tuple[cst.Call, StmtRef]] = []
    for site in scope.calls:
        if site.callee == "super":
            finder = _CalledOn(site.call)
            walk(site.where.stmt, finder)
            found += [(call, site.where) for call in finder.found]
    return found


class _CalledOn(cst.CSTVisitor):
    """The calls of a method of `receiver`'s value: `receiver.method(...)`."""

    def __init__(self, receiver: cst.Call) -> None:
        self.receiver = receiver
        self.found: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        if type(node.func) is cst.Attribute and node.func.value is self.receiver:
            self.found.append(node)


def _first_where_called(
    roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call, where: StmtRef, seen: frozenset[int]
) -> bool:
    """Put the statement holding `call` under `with accelerator.main_process_first():` where the
    accelerator is at hand, or else the statements that call `scope` (recursively); False when some
    path cannot be wrapped (no caller in the files migrated, a caller that cannot reach it)."""
    if roles.can_reach(scope) and not roles.needs_parameter(scope) and _unreachable_method(roles, scope) is None:
        what = "this dataset is built with `download=`" if not seen else \
            f"`{cst.Module([]).code_for_node(call.func)}(...)` builds a dataset with `download=`"
        _first_on_main_process(roles, plan, scope, call, where.stmt, what)
        return True
    if not scope.is_function or id(scope) in seen or len(seen) > 4:
        return False
    callers = roles.call_sites(scope)
    if not callers:
        return False
    ok = True
    for caller, outer in callers:
        site = next((s for s in (*caller.calls, *caller.library_calls, *caller.method_calls) if s.call is outer), None)
        if site is None:
            ok = False
        elif not (rank_guarded(site.where) or _goes_first(site.where)):
            ok = _first_where_called(roles, plan, caller, outer, site.where, seen | {id(scope)}) and ok
    return ok


def _first_on_main_process(
    roles: Roles, plan: EditPlan, scope: Scope, call: cst.Call, stmt: cst.BaseStatement, what: str
) -> None:
    """Run `stmt` under `with accelerator.main_process_first():`, or report why it cannot."""
    if stmt in plan.main_process_first or stmt in plan.main_process_only:
        return
    problem: str | None = None
    if type(stmt) is not cst.SimpleStatementLine:
        problem = ("the call is part of the header of a compound statement; build it in a statement of its "
                   "own under `with accelerator.main_process_first():`")
    elif stmt in plan.replace_stmt:
        problem = "another rule rewrites this statement; put it under `with accelerator.main_process_first():`"
    else:
        hazard = _hazard(roles, scope, stmt, set())
        if hazard is not None:
            problem = (f"the statement also {hazard}, which may wait for the other processes while they "
                       "wait for the main process; build the dataset in a statement of its own under "
                       "`with accelerator.main_process_first():`")
    if problem is not None:
        plan.report(CODE, call, (
            f"{what}: every process downloads and unpacks it into the same folder at once, and it cannot "
            f"be built by the main process first: {problem}"), unconverted=True)
        return
    plan.main_process_first.add(stmt)
    plan.use_accelerator(scope)
    plan.change(CODE, stmt, (
        f"{what}: built under `with accelerator.main_process_first():` (the main process downloads, "
        "the others then find the files)"))


def _downloads(scope: Scope, call: cst.Call) -> bool:
    """`download=True` (or any value but a literal False/None) among the call's keywords. Not a
    parameter of the function passed on (`download=download`): its callers decide."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "download":
            value = arg.value
            return not (type(value) is cst.Name and (value.value in ("False", "None") or value.value in scope.params))
    return False
