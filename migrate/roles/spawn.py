"""`mp.spawn` launchers: the shape AM007 converts, or the reason it refuses.

See `SpawnLaunch` for the exact shape; every other use of `torch.multiprocessing.spawn` is refused
(AM007) with the reason and the fix (make the worker the entry point under `accel launch`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import libcst as cst

from migrate.analysis import Binding, Facts, Scope, StmtRef
from migrate.roles import spawn_namespace
from migrate.imports import is_docstring
from migrate.roles.calls import is_expression_statement
from migrate.roles.model import DISTRIBUTED, Finding, Roles
from migrate.roles.spawn_namespace import NamespaceRank
from migrate.walk import walk

_SPAWNERS = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.start_processes"})


_SPAWN_PARAMETERS = ("fn", "args", "nprocs", "join", "daemon", "start_method")


_INIT_PROCESS_GROUP = "torch.distributed.init_process_group"


_MASTER_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})


_DEVICE_COUNTS = frozenset({"torch.cuda.device_count", "torch.accelerator.device_count"})


@dataclass(eq=False)
class SpawnLaunch:
    """`mp.spawn(worker, args=(a, b), nprocs=N)` in a shape AM007 converts to `worker(rank, a, b)`.

    Understood only when: the call is a statement of its own (outside loops, `join` left true);
    `worker` is a function of this file called nowhere else, taking the spawn index then exactly
    the written-out `args`; the file initialises its process group once, as a statement directly in
    the worker's body, with `rank=` (if given) the spawn index and `world_size=` (if given) a
    parameter that receives `nprocs`; `nprocs`, when a name, feeds only this call; and
    `MASTER_ADDR` / `MASTER_PORT` are only assigned (`os.environ[...] = ...`) in the worker or the
    spawning scope. Anything else is refused with the reason (`spawn_launch`).
    """

    call: cst.Call
    stmt: cst.BaseStatement
    worker: Scope
    args: list[cst.BaseExpression]
    world_size_args: set[int]  # indexes of `args` that pass `nprocs` (the number of processes on this node)
    nprocs: cst.BaseExpression
    nprocs_binding: cst.BaseStatement | None  # `world_size = torch.cuda.device_count()`, read only by the spawn
    master_env: list[cst.BaseStatement]  # `os.environ["MASTER_PORT"] = ...`: torchrun sets them
    environ: str | None  # how this file spells `os.environ` (None: it imports neither `os` nor `environ`)
    namespace: NamespaceRank | None = None  # rank and world size computed into `args` (`spawn_namespace`)
    fallback: DirectFallback | None = None  # `else: worker(args.gpu, ...)`: replaced with the spawn
    setup: SetupHelper | None = None  # `ddp_setup(rank, world_size)` in the worker: becomes the Accelerator


@dataclass(eq=False)
class DirectFallback:
    """`if ngpus > 1: mp.spawn(worker, nprocs=ngpus, args=(ngpus, args)) else: worker(0, 1, args)`
    (the ImageNet example's lineage): the other branch calls the worker directly, once, as one
    process. Both paths become the one direct call AM007 writes for the spawn, which runs as one
    process without a launcher and as one of N under `accel launch`; the whole `if` goes.

    Understood only when the `if` has exactly these two branches (no `elif`), each holding only its
    call (the spawn's branch may also assign attributes of the namespace the spawn passes,
    `args.world_size = ngpus * args.world_size`, where `spawn_namespace` removes them: the launcher
    gives the world size), and the direct call passes the spawn's `args` as written except where
    the spawn passes the process count (`1` there, say)."""

    stmt: cst.If  # the `if` holding both launch paths: replaced by the one call
    call: cst.Call  # the direct call
    rank: cst.BaseExpression  # what the direct call passed as the worker's index (`args.gpu`, `0`)
    # `args.world_size = ngpus * args.world_size` beside the spawn: namespace computations the
    # launcher makes obsolete (accepted only where `spawn_namespace` removes them)
    extra: list[cst.BaseStatement] = field(default_factory=list)


@dataclass(eq=False)
class SetupHelper:
    """`ddp_setup(rank, world_size)`, a statement of the worker's body, calling a function of this
    file that only sets `MASTER_ADDR` / `MASTER_PORT`, pins the GPU (`torch.cuda.set_device`) and
    initialises the process group from the spawn index and the process count: the call becomes
    `accelerator = Accelerator()`, and the function, called nowhere else, goes."""

    scope: Scope  # the helper
    call_stmt: cst.BaseStatement  # its call in the worker
    order: int  # document order of that call


# refusals (by id, while `spawn_launch` runs) saying the launcher is not `spawn_namespace`'s shape
_NOT_NAMESPACE: set[int] = set()


_SETUP_CALLS = frozenset({_INIT_PROCESS_GROUP, "torch.cuda.set_device", "torch.accelerator.set_device_index"})


def spawn_refusal(node: cst.CSTNode, why: str) -> Finding:
    return Finding(
        DISTRIBUTED,
        node,
        f"the script starts its own processes with `mp.spawn`; it was left as it is: {why}. Make the worker "
        "the entry point (take the rank from `LOCAL_RANK`, let `accel launch --nproc-per-node N` start the "
        "processes) and run accel-migrate again", unconverted=True,
    )


def spawn_launch(facts: Facts) -> SpawnLaunch | Finding | None:
    """The file's `mp.spawn` launcher when AM007 can convert it, a refusal saying why not, or None."""
    sites = [(scope, c) for scope in facts.scopes for c in scope.library_calls if c.qualified in _SPAWNERS]
    if not sites:
        return None
    if len(sites) > 1:
        return spawn_refusal(sites[1][1].call, "it spawns processes more than once")
    scope, site = sites[0]
    call = site.call
    stmt = site.where.stmt
    if site.where.in_loop or not is_expression_statement(stmt, call):
        return spawn_refusal(call, "the spawn call is not a statement of its own outside loops (its result is used)")
    given: dict[str, cst.BaseExpression] = {}
    for index, arg in enumerate(call.args):
        if arg.star:
            return spawn_refusal(call, "its arguments are unpacked with `*`")
        if arg.keyword is not None:
            given[arg.keyword.value] = arg.value
        elif index < len(_SPAWN_PARAMETERS):
            given[_SPAWN_PARAMETERS[index]] = arg.value
    join = given.get("join")
    if join is not None and not (isinstance(join, cst.Name) and join.value == "True"):
        return spawn_refusal(call, "it does not join its processes (`join=False`)")
    fn = given.get("fn")
    worker = facts.functions.get(fn.value) if isinstance(fn, cst.Name) else None
    if worker is None or worker.parent is not facts.module_scope:
        return spawn_refusal(call, "the spawned function is not a function defined at the top of this file")
    args_value = given.get("args")
    if args_value is None:
        args: list[cst.BaseExpression] = []
    elif isinstance(args_value, cst.Tuple) and not any(isinstance(e, cst.StarredElement) for e in args_value.elements):
        args = [e.value for e in args_value.elements]
    else:
        return spawn_refusal(call, "its `args` is not a tuple written out in the call")
    if not worker.simple_signature or len(worker.params) != 1 + len(args):
        return spawn_refusal(
            call, f"`{worker.name}` does not take exactly the spawn index and the {len(args)} `args` as plain parameters"
        )
    nprocs = given.get("nprocs") or cst.Integer("1")
    code = facts.module.code_for_node
    world_size_args = {i for i, a in enumerate(args) if code(a) == code(nprocs)}
    fallback = _direct_fallback(facts, site.where, worker, args, world_size_args)
    if isinstance(fallback, tuple):
        direct, why = fallback
        return spawn_refusal(
            direct, f"`{worker.name}` is also called directly here, in the other branch of the spawn's `if`; {why}"
        )
    for other in facts.scopes:
        for direct in other.calls:
            if direct.callee == worker.name and (fallback is None or direct.call is not fallback.call):
                return spawn_refusal(
                    direct.call, f"`{worker.name}` is also called directly here, a second launch path next to the spawn"
                )
    flag = fallback.stmt.test if fallback is not None else None
    _NOT_NAMESPACE.clear()
    init = _spawn_worker_init(facts, worker, world_size_args, nprocs, scope, stmt, args, flag)
    if isinstance(init, Finding) and fallback is not None and fallback.extra and id(init) in _NOT_NAMESPACE:
        init = None  # not the namespace shape: the spawn's branch computing more than the launch is the reason
    if isinstance(init, Finding):
        return init
    setup = init if isinstance(init, SetupHelper) else None
    namespace = init if isinstance(init, NamespaceRank) else None
    if fallback is not None:
        for extra in fallback.extra:
            target = _namespace_assignment(extra)
            if namespace is None or target is None or target[0] != namespace.outer or target[1] not in namespace.attributes.values():
                return spawn_refusal(
                    fallback.call, f"`{worker.name}` is also called directly here, in the other branch of the spawn's "
                    f"`if`; {_extra_statement(facts, extra)}"
                )
        if namespace is not None:
            # the whole `if` becomes the one direct call: nothing inside it is pruned on its own
            inside = {id(s) for s in spawn_namespace.statements_of(fallback.stmt)}
            for removed in [s for s in namespace.replace if id(s) in inside]:
                del namespace.replace[removed]
    nprocs_binding: cst.BaseStatement | None = None
    if isinstance(nprocs, cst.Name):
        bindings = scope.bindings.get(nprocs.value, [])
        reads = _own_name_count(scope.node, nprocs.value) - len(bindings)
        # with a direct fallback, the `if ngpus > 1:` test and the direct call go with the spawn
        in_call = _own_name_count(fallback.stmt if fallback is not None else call, nprocs.value)
        # an `if ngpus == 1 and ...: warnings.warn(...)` only advises: it reads the count, changes nothing
        advisory = sum(_own_name_count(a, nprocs.value) for a in _advisory_ifs(facts, scope.node))
        if reads - advisory != in_call:
            return spawn_refusal(call, f"`{nprocs.value}` (the number of processes) is also used for other things")
        others = sum(_own_name_count(a, nprocs.value) for i, a in enumerate(args) if i not in world_size_args)
        if len(bindings) == 1 and not others and _is_process_count(facts, bindings[0]):
            nprocs_binding = bindings[0].where.stmt
    worker_node = worker.node
    assert isinstance(worker_node, cst.FunctionDef) and isinstance(worker_node.body, cst.IndentedBlock)
    spawning = (site.where.block.body, site.where.path[-1].block.body) if fallback is not None else (site.where.block.body,)
    helper_body: tuple[Sequence[cst.BaseStatement], ...] = ()
    if setup is not None:
        helper_node = setup.scope.node
        assert isinstance(helper_node, cst.FunctionDef) and isinstance(helper_node.body, cst.IndentedBlock)
        helper_body = (helper_node.body.body,)  # goes with the helper
    master_env = _master_env_statements(facts, (worker_node.body.body, *spawning, *helper_body))
    if isinstance(master_env, Finding):
        return master_env
    os_names = facts.aliases.local_names_for("os")
    environ_names = facts.aliases.local_names_for("os.environ")
    environ = f"{os_names[0]}.environ" if os_names else (environ_names[0] if environ_names else None)
    return SpawnLaunch(
        call, stmt, worker, args, world_size_args, nprocs, nprocs_binding, master_env, environ, namespace, fallback,
        setup,
    )


def _direct_fallback(
    facts: Facts, where: StmtRef, worker: Scope, args: list[cst.BaseExpression], world_size_args: set[int]
) -> DirectFallback | tuple[cst.Call, str] | None:
    """The `else` (or `if`) branch beside the spawn that calls the worker directly (`DirectFallback`);
    the direct call and why not, when it passes other arguments than the spawn or the spawn's
    branch does more than spawn."""
    parent = where.path[-1].stmt if where.path else None
    if type(parent) is not cst.If or type(parent.orelse) is not cst.Else:
        return None
    branches = [parent.body, parent.orelse.body]
    if not all(type(b) is cst.IndentedBlock for b in branches):
        return None
    mine = next((b for b in branches if any(stmt is where.stmt for stmt in b.body)), None)
    others = [b for b in branches if b is not mine]
    if mine is None or len(others) != 1 or len(others[0].body) != 1:
        return None
    other = others[0].body[0]
    small = other.body[0] if type(other) is cst.SimpleStatementLine and len(other.body) == 1 else None
    direct = small.value if type(small) is cst.Expr else None
    if not (type(direct) is cst.Call and type(direct.func) is cst.Name and direct.func.value == worker.name):
        return None
    if facts.function_called(direct) is not worker:
        return None
    extras = [stmt for stmt in mine.body if stmt is not where.stmt]
    for extra in extras:
        if _namespace_assignment(extra) is None:
            return direct, _extra_statement(facts, extra)
    other_arguments = (
        "it passes other arguments than the spawn's `args`: pass the same ones after the index (the process count "
        "may differ where the spawn passes `nprocs`), so that both paths become one call"
    )
    if len(direct.args) != 1 + len(args) or any(a.star or a.keyword is not None for a in direct.args):
        return direct, other_arguments
    code = facts.module.code_for_node
    for index, (passed, spawned) in enumerate(zip(direct.args[1:], args)):
        if index not in world_size_args and code(passed.value) != code(spawned):
            return direct, other_arguments
    return DirectFallback(parent, direct, direct.args[0].value, extras)


def _extra_statement(facts: Facts, extra: cst.BaseStatement) -> str:
    return (
        f"the spawn's branch also runs `{facts.module.code_for_node(extra.with_changes(leading_lines=())).strip()}`, "
        "which the direct path does not, so the two paths are not one call"
    )


def _namespace_assignment(stmt: cst.BaseStatement) -> tuple[str, str] | None:
    """`args.world_size = ...` alone on its line: (`args`, `world_size`)."""
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
    elif isinstance(small, cst.AugAssign):
        target = small.target
    else:
        return None
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
        return target.value.value, target.attr.value
    return None


def _spawn_worker_init(
    facts: Facts, worker: Scope, world_size_args: set[int], nprocs: cst.BaseExpression,
    spawn_scope: Scope, spawn_stmt: cst.BaseStatement, args: list[cst.BaseExpression],
    spawn_test: cst.BaseExpression | None = None,
) -> Finding | NamespaceRank | SetupHelper | None:
    """The one `init_process_group`: a statement of the worker's body whose rank is the spawn index,
    the namespace the spawning function computed the rank and the world size into, or a statement
    of the worker's setup helper (`SetupHelper`)."""
    inits = [(s, c) for s in facts.scopes for c in s.library_calls if c.qualified == _INIT_PROCESS_GROUP]
    node = worker.node
    assert isinstance(node, cst.FunctionDef)
    if not inits:
        return spawn_refusal(node, f"`{worker.name}` initialises no process group: its processes are not a "
                              "data-parallel group an Accelerator could replace")
    if len(inits) > 1:
        return spawn_refusal(inits[1][1].call, "the process group is initialised in more than one place")
    scope, init = inits[0]
    setup: SetupHelper | None = None
    if scope is not worker:
        found = _setup_helper(facts, worker, scope)
        if isinstance(found, SetupHelper):
            setup = found
            expected = _expected_through(facts, worker, setup, world_size_args)
            checked = _check_init_arguments(facts, init.call, expected, nprocs)
            return checked if checked is not None else setup
    not_in_worker = spawn_refusal(
        init.call,
        f"the process group is initialised here, not as a statement of the worker `{worker.name}` itself: "
        f"move this setup into `{worker.name}`",
    )
    # `if args.distributed: ...; init_process_group(...)`: a guard of the worker's own body (the
    # namespace shape only, see `spawn_namespace`)
    guard = init.where.path[0].stmt if len(init.where.path) == 1 else None
    if not (type(guard) is cst.If and guard.orelse is None and init.where.path[0].block is node.body
            and init.where.block is guard.body):
        guard = None
    if scope is not worker or not is_expression_statement(init.where.stmt, init.call) or (
        init.where.block is not node.body and guard is None
    ):
        return not_in_worker
    spawner = spawn_scope.node
    if isinstance(spawner, cst.FunctionDef):
        found = spawn_namespace.find(
            facts.module, spawner, spawn_stmt, node, args, init.call, init.where.stmt, guard, spawn_test
        )
        if isinstance(found, spawn_namespace.NotThisShape):
            refusal = spawn_refusal(init.call, found)
            _NOT_NAMESPACE.add(id(refusal))
            return refusal
        if isinstance(found, spawn_namespace.At) and found.node is not None:
            return spawn_refusal(found.node, found)
        if isinstance(found, str):
            return spawn_refusal(init.call, found)
        if found is not None:
            return found
    if guard is not None:
        return not_in_worker
    expected = {"rank": {worker.params[0]}, "world_size": {worker.params[1 + i] for i in world_size_args}}
    return _check_init_arguments(facts, init.call, expected, nprocs)


def _check_init_arguments(
    facts: Facts, call: cst.Call, expected: dict[str, set[str]], nprocs: cst.BaseExpression
) -> Finding | None:
    """`rank=` must be the spawn index and `world_size=` the process count (names in `expected`)."""
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else ("backend" if index == 0 else None)
        matches = isinstance(arg.value, cst.Name) and arg.value.value in expected.get(keyword or "", set())
        if keyword == "world_size" and facts.module.code_for_node(arg.value) == facts.module.code_for_node(nprocs):
            matches = True  # `world_size=2` next to `nprocs=2`
        if keyword in expected and not matches:
            what = "the spawn index" if keyword == "rank" else "the number of spawned processes"
            return spawn_refusal(
                call, f"`{keyword}={facts.module.code_for_node(arg.value)}` is not {what}; the Accelerator's "
                f"{keyword} comes from the launcher"
            )
        if keyword is None:
            return spawn_refusal(call, "`init_process_group` takes positional arguments after the backend")
    return None


def _setup_helper(facts: Facts, worker: Scope, helper: Scope) -> SetupHelper | None:
    """`helper` as the worker's `SetupHelper`, or None when it is not one."""
    node = helper.node
    if not (helper.is_function and not helper.is_method and helper.parent is facts.module_scope):
        return None
    if not (isinstance(node, cst.FunctionDef) and isinstance(node.body, cst.IndentedBlock) and helper.simple_signature):
        return None
    sites = [(scope, site) for scope in facts.scopes for site in scope.calls if facts.resolve(site.callee, scope) is helper]
    if len(sites) != 1 or sites[0][0] is not worker:
        return None
    site = sites[0][1]
    worker_node = worker.node
    assert isinstance(worker_node, cst.FunctionDef)
    if site.where.block is not worker_node.body or not is_expression_statement(site.where.stmt, site.call):
        return None
    if len(site.call.args) != len(helper.params) or any(a.star or a.keyword is not None for a in site.call.args):
        return None
    for index, stmt in enumerate(node.body.body):
        if index == 0 and is_docstring(stmt):
            continue
        if not _setup_statement(facts, stmt):
            return None
    return SetupHelper(helper, site.where.stmt, site.where.order)


def _setup_statement(facts: Facts, stmt: cst.BaseStatement) -> bool:
    """`os.environ["MASTER_PORT"] = ...`, `torch.cuda.set_device(...)` or `init_process_group(...)`."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return facts.aliases.qualify(small.value.func) in _SETUP_CALLS
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Subscript) and facts.aliases.qualify(target.value) == "os.environ":
            element = target.slice[0].slice
            key = element.value if isinstance(element, cst.Index) else None
            return isinstance(key, cst.SimpleString) and key.evaluated_value in _MASTER_VARIABLES
    return False


def _expected_through(
    facts: Facts, worker: Scope, setup: SetupHelper, world_size_args: set[int]
) -> dict[str, set[str]]:
    """The helper's parameters that receive the spawn index and the process count."""
    stmt = setup.call_stmt
    assert isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr)
    call = stmt.body[0].value
    assert isinstance(call, cst.Call)
    counts = {worker.params[1 + i] for i in world_size_args}
    expected: dict[str, set[str]] = {"rank": set(), "world_size": set()}
    for param, arg in zip(setup.scope.params, call.args):
        if isinstance(arg.value, cst.Name) and arg.value.value == worker.params[0]:
            expected["rank"].add(param)
        elif isinstance(arg.value, cst.Name) and arg.value.value in counts:
            expected["world_size"].add(param)
    return expected


def _master_env_statements(
    facts: Facts, blocks: tuple[Sequence[cst.BaseStatement], ...]
) -> list[cst.BaseStatement] | Finding:
    """`os.environ["MASTER_ADDR"] = ...` statements of `blocks` (the worker's body, the block that
    spawns); refused when set any other way."""
    found: list[cst.BaseStatement] = []
    assigned: set[int] = set()
    for block in blocks:
        for stmt in block:
            small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            target = small.targets[0].target
            if not (isinstance(target, cst.Subscript) and facts.aliases.qualify(target.value) == "os.environ"):
                continue
            element = target.slice[0].slice
            key = element.value if isinstance(element, cst.Index) else None
            if isinstance(key, cst.SimpleString) and key.evaluated_value in _MASTER_VARIABLES:
                found.append(stmt)
                assigned.add(id(key))

    class Strings(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            if id(node) not in assigned and node.evaluated_value in _MASTER_VARIABLES:
                others.append(node)

    others: list[cst.SimpleString] = []
    walk(facts.module, Strings())
    if others:
        return spawn_refusal(others[0], f"`{others[0].evaluated_value}` is used here other than assigned in the "
                              "worker or the spawning code (torchrun sets it)")
    return found


def check_spawn_worker(roles: Roles, spawn: SpawnLaunch) -> None:
    """The Accelerator must be created in the worker: it replaces the worker's process group."""
    if roles.accelerator_exists:
        why = "the script already creates an Accelerator, which each spawned worker would build on its own"
    elif roles.home is None:
        why = f"no optimizer is built in this file, so the worker `{spawn.worker.name}` has nothing to prepare"
    elif roles.accelerator_scope is not spawn.worker:
        where = roles.accelerator_scope.name if roles.accelerator_scope is not None else "another scope"
        why = (
            f"the Accelerator would be created in `{where}` (where the optimizer is built), not in the worker "
            f"`{spawn.worker.name}` that initialises the process group: build the optimizer in `{spawn.worker.name}`"
        )
    else:
        roles.spawn = spawn
        if spawn.namespace is not None:
            _flag_sampled_loaders(roles, set(spawn.namespace.flags))
        return
    roles.refused = True
    roles.findings = [spawn_refusal(spawn.call, why)]


def find_group_flag(roles: Roles) -> None:
    """`if args.distributed: ...; init_process_group(...)` (no `else`) in the scope that creates the
    Accelerator, the flag (`args.distributed`, or a name) also read elsewhere: the group exists
    exactly when the flag is true, and with the Accelerator exactly when there are several processes,
    so AM007 sets the flag to `accelerator.num_processes > 1` before that `if`
    (`Roles.group_flag`), and the loaders whose sampler is a DistributedSampler only under the flag
    shard themselves."""
    scope = roles.accelerator_scope
    if scope is not None and roles.accelerator_exists:
        _flag_sampled_loaders(roles, _migrated_flags(roles))  # a second run over AM007's output
        return
    if scope is None:
        return
    inits = [c for c in scope.library_calls if c.qualified == _INIT_PROCESS_GROUP]
    if len(inits) != 1:
        return
    where = inits[0].where
    guard = where.path[-1].stmt if where.path else None
    if where.in_loop or type(guard) is not cst.If or guard.orelse is not None or where.block is not guard.body:
        return
    if not is_expression_statement(where.stmt, inits[0].call):
        return
    test = guard.test
    if type(test) is cst.Attribute and type(test.value) is cst.Name:
        attribute = test.attr.value
        reads = spawn_namespace.attribute_read_count(roles.facts.module, attribute)
    elif type(test) is cst.Name:
        attribute = None
        bindings = scope.bindings.get(test.value, [])
        code = roles.facts.module.code_for_node
        if any(b.value is not None and "environ" in code(b.value) for b in bindings):
            return  # `ddp = "RANK" in os.environ`: the launcher's answer already
        reads = _own_name_count(scope.node, test.value) - len(bindings)
    else:
        return
    if reads <= 1:
        return  # only the `if` itself reads it
    roles.group_flag = (guard, test)
    if attribute is not None:
        _flag_sampled_loaders(roles, {attribute})


def _migrated_flags(roles: Roles) -> set[str]:
    """The flags AM007 set on a first run, `args.distributed = accelerator.num_processes > 1`: read on
    a second run, a `DistributedSampler(d) if args.distributed else None` still shards its loader by
    rank (as the `if`/`else` form of it is seen to), so it stays unprepared and its batch moves stay."""
    text = roles.facts.text
    if text is not None and "num_processes" not in text:
        return set()  # every migrated file is run again: no walk where no flag can be
    found = _FlagsSet()
    walk(roles.facts.module, found)
    return found.flags


class _FlagsSet(cst.CSTVisitor):
    """`x.flag = accelerator.num_processes > 1` anywhere in the module: the `flag` names."""

    def __init__(self) -> None:
        self.flags: set[str] = set()

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if not (isinstance(value, cst.Comparison) and len(value.comparisons) == 1
                and isinstance(value.comparisons[0].operator, cst.GreaterThan)
                and isinstance(value.comparisons[0].comparator, cst.Integer)
                and value.comparisons[0].comparator.value == "1"
                and isinstance(value.left, cst.Attribute) and value.left.attr.value == "num_processes"):
            return
        for target in node.targets:
            if isinstance(target.target, cst.Attribute) and isinstance(target.target.value, cst.Name):
                self.flags.add(target.target.attr.value)


def _flag_sampled_loaders(roles: Roles, flags: set[str]) -> None:
    """`sampler = DistributedSampler(data) if args.distributed else None` where AM007 sets
    `args.distributed = accelerator.num_processes > 1`: on N processes the loader shards itself, so
    it is one that shards by rank (kept unprepared, AM004 says so), not one to prepare."""
    from migrate.roles.loaders import DISTRIBUTED_SAMPLER, call_name, loader_calls, sampler_values

    home = roles.home
    if not flags or home is None:
        return
    for name in roles.loaders:
        if name in roles.rank_sampled:
            continue
        for scope, call in loader_calls(roles, home, name):
            for value in sampler_values(roles, scope, call):
                if not isinstance(value, cst.IfExp) or not spawn_namespace.reads_attributes(value.test, flags):
                    continue
                if any(call_name(roles, branch, DISTRIBUTED_SAMPLER) for branch in (value.body, value.orelse)):
                    roles.rank_sampled[name] = call


def _is_process_count(facts: Facts, binding: Binding) -> bool:
    """`world_size = 2` or `= torch.cuda.device_count()`: a statement that can go without side effects."""
    value, stmt = binding.value, binding.where.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and value is not None):
        return False
    if isinstance(value, cst.Integer):
        return True
    return isinstance(value, cst.Call) and not value.args and facts.aliases.qualify(value.func) in _DEVICE_COUNTS


_ADVISORY = frozenset({"warnings.warn", "print", "logging.warning", "logging.info"})


def _advisory_ifs(facts: Facts, node: cst.CSTNode) -> list[cst.If]:
    """`if <test>: warnings.warn(...)` statements in `node` (no `else`, only warnings or prints)."""
    found: list[cst.If] = []

    class Visitor(cst.CSTVisitor):
        def visit_If(self, stmt: cst.If) -> None:
            body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else ()
            if stmt.orelse is None and body and all(
                type(inner) is cst.SimpleStatementLine
                and all(type(small) is cst.Expr and type(small.value) is cst.Call
                        and (facts.aliases.qualify(small.value.func) or "") in _ADVISORY for small in inner.body)
                for inner in body
            ):
                found.append(stmt)

    walk(node, Visitor())
    return found


def _own_name_count(node: cst.CSTNode, name: str) -> int:
    """How often `name` occurs as a name in `node`, outside the functions and classes inside it."""
    count = 0

    class Visitor(cst.CSTVisitor):
        def visit_Name(self, found: cst.Name) -> None:
            nonlocal count
            count += found.value == name

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            walk(attribute.value, self)
            return False

        def visit_FunctionDef(self, inner: cst.FunctionDef) -> bool:
            if inner is node:
                return True
            for decorator in inner.decorators:
                walk(decorator, self)
            return False

        def visit_ClassDef(self, inner: cst.ClassDef) -> bool:
            return False

    walk(node, Visitor())
    return count
