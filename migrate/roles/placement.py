"""Where `accelerator = Accelerator()` and `accelerator.prepare(...)` are written.

The Accelerator replaces the first device choice outside loops in home (else at module level), or
goes before home's first statement. `prepare` goes after the last setup binding of every training
object, evaluation loader and epoch scheduler built before training starts, in the deepest block
they share. Objects built inside a loop are prepared in it when every iteration builds all of them
and then trains them (`for fold in range(K):`), after `accelerator.free_memory()`; otherwise they
are reported (AM004) and not prepared, with the reason (some built once outside the loop, the
loop does not train them, training runs after the loop too, or a state-dict load follows a hand
wrap in the loop). A training object
first bound after training has started (`train(model, first)` then `loader = DataLoader(...)`)
refuses the file (AM004): one prepare after it would leave the first training step unprepared."""

from __future__ import annotations

import libcst as cst

from migrate.analysis import Binding, DeviceBinding, Facts, Scope, StmtRef
from migrate.imports import is_docstring
from migrate.names import instance_attribute
from migrate.roles.calls import HAND_WRAPPERS, is_expression_statement
from migrate.roles.loaders import draws_through
from migrate.roles.model import PREPARE, Finding, Roles
from migrate.roles import step_aliases
from migrate.roles.setup_device import setup_device_choices


def place_accelerator(roles: Roles) -> None:
    if roles.accelerator_exists:
        return
    home = roles.home
    assert home is not None
    module = roles.facts.module_scope
    setups = {id(d.where.stmt) for s in (home, _sole_caller(roles, home)) if s is not None
              for d in setup_device_choices(roles.facts, s)}
    local = _by_order([d for d in home.devices if not d.where.in_loop], setup_device_choices(roles.facts, home))
    globals_ = [d for d in module.devices if not d.where.in_loop and not (home is not module and home.binds(d.name))]
    caller = _sole_caller(roles, home)
    # Only a choice made in the caller's own body, not in one branch of its setup (where an
    # Accelerator created in the branch would be unbound in the other).
    upstream = (
        _by_order([d for d in caller.devices if not d.where.path], setup_device_choices(roles.facts, caller))
        if caller is not None else []
    )
    constructor, held = _constructor_device(roles, home)
    for scope, candidates in ((home, local), (constructor, held), (caller, upstream), (module, globals_)):
        if candidates and scope is not None:
            first = _deciding_choice(candidates)
            roles.device_binding = candidates[first]
            roles.accelerator_scope = scope
            # `DEVICE = "cpu"` ... `if __name__ == "__main__": DEVICE = torch.device("cuda")`: every
            # later choice of the same name must become `accelerator.device` too.
            roles.later_device_bindings = [d for d in candidates[first + 1:] if d.name == candidates[first].name]
            roles.device_from_setup = id(candidates[first].where.stmt) in setups
            if roles.device_from_setup or any(id(d.where.stmt) in setups for d in roles.later_device_bindings):
                # the setup call stays where it is; chosen again later, the same name is rebound
                roles.later_device_bindings = [d for d in roles.later_device_bindings if id(d.where.stmt) not in setups]
            return
    roles.accelerator_scope = home
    roles.create_before = first_code_statement(roles.facts, home)


def _constructor_device(roles: Roles, home: Scope) -> tuple[Scope | None, list[DeviceBinding]]:
    """The device a class holds on an attribute, chosen in its constructor's own body
    (`self.device = torch.device("cuda" if ... else "cpu")` in `__init__`) when home is another
    method of that class (`build_model`, which `__init__` calls after choosing the device). Every
    method of the instance runs after the constructor, so the Accelerator is created there, as
    `self.accelerator`, and `self.device` becomes `self.accelerator.device`: the tensors the
    methods move `.to(self.device)` land where the prepared models are. A choice made after the
    constructor calls home is not taken (home's `prepare` would run before the Accelerator exists)."""
    if not home.is_method:
        return None, []
    constructor = roles.constructor_of(home)
    if constructor is None or constructor is home:
        return None, []
    # a choice in the constructor's own body, or in one branch of an `if` there whose other branch
    # names the device too (`if config.device == "auto": ... else: self.device = config.device`)
    held = [d for d in constructor.devices if d.name.startswith("self.")
            and (not d.where.path or (len(d.where.path) == 1 and flag_choice(d, []) is not None))]
    calls = [site.where.order for site in constructor.calls if site.callee == f"self.{home.name}"]
    return constructor, [d for d in held if d.where.order < min(calls, default=1 << 60)]


def _by_order(choices: list[DeviceBinding], setups: list[DeviceBinding]) -> list[DeviceBinding]:
    """The scope's device choices and its `device = setup()` calls, in document order."""
    return sorted([*choices, *setups], key=lambda d: d.where.order)


def _deciding_choice(candidates: list[DeviceBinding]) -> int:
    """Which device choice the Accelerator replaces: the first, unless it only asks whether a GPU
    is there and the same name is chosen again later by a flag of the command line
    (`DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")` at the top, then
    `DEVICE = torch.device("cuda" if args.backend == "gpu" else "cpu")` under `__main__` once the
    arguments are parsed). The flag decides where the script runs, so the Accelerator is created
    there, with `cpu=` derived from it (AM001); the first choice stays as it is, replaced before
    training starts."""
    name = candidates[0].name
    same = [i for i, d in enumerate(candidates) if d.name == name]
    if flag_choice(candidates[0], [candidates[i] for i in same[1:]]) is not None:
        return 0
    for position, index in enumerate(same[1:], 1):
        if flag_choice(candidates[index], [candidates[i] for i in same[position + 1:]]) is not None:
            return index
    return 0


def flag_choice(first: DeviceBinding, later: list[DeviceBinding]) -> tuple[cst.BaseExpression, bool] | None:
    """The test of a flag that picks between an accelerator and the CPU at the device choice
    `first` (`later`: the same name chosen after it), and whether a true test means the CPU:
    `torch.device("cuda" if args.cuda else "cpu")`, or `if use_accel: device = torch.device("cuda")
    else: device = torch.device("cpu")`. None when the test only asks whether a GPU is there
    (`torch.cuda.is_available()`: the Accelerator checks that itself) or both sides are alike."""
    value = first.value
    named = _named_device(value)
    if named is not None:
        return named, True
    if type(value) is cst.Call and len(value.args) == 1:
        value = value.args[0].value  # torch.device(<choice>)
    if type(value) is cst.IfExp:
        body, orelse = is_cpu_device(value.body), is_cpu_device(value.orelse)
        if body == orelse:
            return None
        if is_availability(value.test):
            parent = first.where.path[-1].stmt if first.where.path else None
            if type(parent) is cst.If and type(parent.orelse) is cst.Else and not is_availability(parent.test):
                return _auto_or_named(parent, first, later)
            return None
        return value.test, body
    if not first.where.path:
        return None
    parent = first.where.path[-1].stmt
    if type(parent) is not cst.If or type(parent.orelse) is not cst.Else or is_availability(parent.test):
        return None
    branches = {"body": parent.body, "orelse": parent.orelse.body}
    side: dict[str, bool] = {}  # branch -> chooses the CPU
    for binding in (first, *later):
        for branch, block in branches.items():
            if type(block) is cst.IndentedBlock and any(stmt is binding.where.stmt for stmt in block.body):
                side[branch] = is_cpu_device(binding.value)
    if len(side) != 2:
        return None
    if side["body"] == side["orelse"]:
        return _auto_or_named(parent, first, later)
    return parent.test, side["body"]


def _auto_or_named(parent: cst.If, first: DeviceBinding, later: list[DeviceBinding]) -> tuple[cst.BaseExpression, bool] | None:
    """`if config.device == "auto": device = "cuda" if torch.cuda.is_available() else "cpu"` /
    `else: device = config.device`: one branch asks whether a GPU is there (the Accelerator's own
    default), the other takes a device the user names. The CPU is chosen when the named branch is
    taken and names the CPU: `not config.device == "auto" and torch.device(config.device).type ==
    "cpu"`, the test written for `Accelerator(cpu=...)`; the named branch's binding becomes the
    Accelerator's device too (`named_branch_choice`), so batches follow the prepared model."""
    assert type(parent.orelse) is cst.Else
    value = first.value
    inner = value.args[0].value if type(value) is cst.Call and len(value.args) == 1 else value
    if not (type(inner) is cst.IfExp and is_availability(inner.test)):
        return None
    blocks = {"body": parent.body, "orelse": parent.orelse.body}
    auto = next((b for b, block in blocks.items() if type(block) is cst.IndentedBlock
                 and any(stmt is first.where.stmt for stmt in block.body)), None)
    if auto is None:
        return None
    branch = "orelse" if auto == "body" else "body"
    named = _assigned_in(blocks[branch], first.name)
    if named is None:
        return None
    if type(named) is cst.Call and len(named.args) == 1 and not named.args[0].keyword:
        named = named.args[0].value  # torch.device(config.device)
    if type(named) not in (cst.Name, cst.Attribute, cst.Subscript):
        return None
    cpu = _named_device(cst.Call(func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("device")),
                                 args=[cst.Arg(named.deep_clone())]))
    if cpu is None:
        return None
    test = parent.test
    if type(test) in (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr):
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    taken = test if branch == "body" else _negated(test)
    return cst.BooleanOperation(left=taken, operator=cst.And(), right=cpu), True


def named_branch_choice(first: DeviceBinding) -> cst.BaseStatement | None:
    """The named side of an `if config.device == "auto": ... else: device = config.device` choice
    (see `_auto_or_named`): the statement of the other branch that binds the same name, when the
    device choice `first` is the branch asking whether a GPU is there."""
    if not first.where.path:
        return None
    parent = first.where.path[-1].stmt
    if type(parent) is not cst.If or type(parent.orelse) is not cst.Else or is_availability(parent.test):
        return None
    if _auto_or_named(parent, first, []) is None:
        return None
    for block in (parent.body, parent.orelse.body):
        if type(block) is not cst.IndentedBlock or any(stmt is first.where.stmt for stmt in block.body):
            continue
        assignment = _assignment_in(block, first.name)
        return assignment[0] if assignment is not None else None
    return None


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not <test>`, written `a != b` for `a == b` (and the reverse)."""
    if type(test) is cst.Comparison and len(test.comparisons) == 1 and not test.lpar:
        op = test.comparisons[0].operator
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}.get(type(op))
        if flipped is not None:
            return test.with_changes(comparisons=[test.comparisons[0].with_changes(
                operator=flipped(whitespace_before=op.whitespace_before, whitespace_after=op.whitespace_after))])
    return cst.UnaryOperation(operator=cst.Not(), expression=test)


def _assigned_in(block: cst.BaseSuite, name: str) -> cst.BaseExpression | None:
    """The value a statement of the block assigns to `name` alone (`device = config.device`)."""
    assignment = _assignment_in(block, name)
    return assignment[1] if assignment is not None else None


def _assignment_in(block: cst.BaseSuite, name: str) -> tuple[cst.SimpleStatementLine, cst.BaseExpression] | None:
    """The first statement of the block that assigns to `name` alone, and the value it assigns."""
    if type(block) is not cst.IndentedBlock:
        return None
    empty = cst.Module([])
    for stmt in block.body:
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            if type(small) is cst.Assign and len(small.targets) == 1 \
                    and empty.code_for_node(small.targets[0].target) == name:
                return stmt, small.value
    return None
    empty = cst.Module([])
    for stmt in block.body:
        if type(stmt) is not cst.SimpleStatementLine:
            continue
        for small in stmt.body:
            if type(small) is cst.Assign and len(small.targets) == 1 \
                    and empty.code_for_node(small.targets[0].target) == name:
                return small.value
    return None


def _named_device(value: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """`torch.device(args.device)`: the device is named by a value the user gives (`--device cpu`),
    so the CPU is chosen when what it names is the CPU: `torch.device(args.device).type == "cpu"`,
    the test written for `Accelerator(cpu=...)`. None for any other device choice (a literal, a
    conditional expression, a formatted `"cuda:{}"` string: those are decided elsewhere)."""
    if not (type(value) is cst.Call and len(value.args) == 1 and value.args[0].keyword is None
            and not value.args[0].star):
        return None
    func = value.func
    if not ((type(func) is cst.Attribute and func.attr.value == "device") or (type(func) is cst.Name and func.value == "device")):
        return None
    named = value.args[0].value
    if type(named) not in (cst.Name, cst.Attribute, cst.Subscript):
        return None
    if "rank" in cst.Module([]).code_for_node(named).lower():
        return None  # `torch.device(local_rank)`: this process's GPU, no user's choice of the CPU
    return cst.Comparison(
        left=cst.Attribute(value=value.with_changes(whitespace_after_func=cst.SimpleWhitespace(""))
                           .deep_clone(), attr=cst.Name("type")),
        comparisons=[cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cpu"'))],
    )


def is_availability(test: cst.BaseExpression) -> bool:
    return (
        type(test) is cst.Call
        and type(test.func) is cst.Attribute
        and test.func.attr.value == "is_available"
    )


def is_cpu_device(value: cst.BaseExpression | None) -> bool:
    if type(value) is cst.Call and len(value.args) == 1:
        value = value.args[0].value  # torch.device("cpu")
    return type(value) is cst.SimpleString and value.evaluated_value == "cpu"


def _sole_caller(roles: Roles, home: Scope) -> Scope | None:
    """The one function that calls home, when home is a plain function: `main()` choosing the
    device (`args.device = torch.device(...)`) and calling `train(args, model)`, which builds the
    optimizer. The Accelerator then replaces main's device choice and reaches `train` as a
    parameter, so main's own device-dependent code (rank checks, moves) can use it too."""
    if not home.is_function or home.is_method:
        return None
    sites = roles.call_sites(home)
    callers = {id(s): s for s, _ in sites}
    if len(callers) != 1:
        return None
    (caller,) = callers.values()
    if not caller.is_function or caller.is_method or caller is home:
        return None
    return caller


def first_code_statement(facts: Facts, scope: Scope) -> cst.BaseStatement | None:
    """The first statement of `scope` that is not its docstring (module: not an import)."""
    if scope is facts.module_scope:
        return facts.import_block_end.stmt if facts.import_block_end else None
    node = scope.node
    assert isinstance(node, cst.FunctionDef)
    if not isinstance(node.body, cst.IndentedBlock):
        return None
    for index, stmt in enumerate(node.body.body):
        if not (index == 0 and is_docstring(stmt)):
            return stmt
    return None


def place_prepare(roles: Roles) -> None:
    home = roles.home
    assert home is not None
    names = [n for n in (*roles.models, *roles.optimizers, *roles.loaders, *roles.schedulers) if n not in home.prepared]
    if not names or home.prepared:
        return
    first_use = _first_training_use(roles)
    per_iteration: StmtRef | None = None
    setup = [r for n in names for r in _setup_bindings(home, n, first_use)]
    if any(r.in_loop for r in setup):
        found = _iteration_loop(roles, home, names, setup)
        if isinstance(found, Finding):
            roles.findings.append(found)
            roles.models.clear()
            roles.optimizers.clear()
            roles.loaders.clear()
            roles.schedulers.clear()
            return
        per_iteration, first_use = found
    refs = [r for n in names for r in _setup_bindings(home, n, first_use, per_iteration)]
    refs += _model_moves(roles, home, first_use, per_iteration)
    # Evaluation loaders and epoch-level schedulers built before training starts belong to the same
    # setup block: prepare after them too. Ones built later (a final test loader) are left out.
    late: set[str] = set()
    for name in (*{loader for _, _, loader in roles.eval_loops}, *roles.epoch_schedulers):
        bound = [b.where for b in home.bindings.get(name, []) if not b.is_loop_target
                 and (per_iteration is None or _within(b.where, per_iteration))]
        if bound and all(r.order < first_use for r in bound):
            refs.extend(bound)
        else:
            late.add(name)
    roles.eval_loops = [entry for entry in roles.eval_loops if entry[2] not in late]
    creation = roles.device_binding.where if roles.device_binding is not None and roles.accelerator_scope is home else None
    if not refs and creation is not None:
        refs.append(creation)
    if not refs:
        roles.prepare_after = None  # everything is a parameter: prepare right after the accelerator
        return
    point = _common_insertion_point(refs)
    if creation is not None and creation.order > point.order:
        # The Accelerator is created after the objects are bound: prepare after it.
        point = _common_insertion_point([*refs, creation])
        if per_iteration is not None and not _within(point, per_iteration):
            roles.findings.append(Finding(PREPARE, creation.stmt, (
                f"the training objects are built anew in every iteration of `{_loop_header(per_iteration)}`, "
                "but the device is chosen (and the Accelerator created) after that loop, so "
                "`accelerator.prepare(...)` was not inserted: choose the device before the loop and run again"),
                unconverted=True))
            roles.models.clear()
            roles.optimizers.clear()
            roles.loaders.clear()
            roles.schedulers.clear()
            return
    late = [n for n in names if (bound := _setup_bindings(home, n, first_use, per_iteration)) and min(r.order for r in bound) > first_use]
    if late and point.order > first_use:
        # `train(model, first, ...)` then `loader = DataLoader(...)` and `train(model, loader, ...)`:
        # one prepare after `loader` would leave the first training call unprepared.
        roles.refused = True
        roles.findings = [Finding(PREPARE, home.bindings[late[0]][0].where.stmt, (
            f"`{late[0]}` is built after training has started in `{home.qualname}` (a training loop or call comes "
            "before it), and `accelerator.prepare(...)` must run once, before the first training step, with every "
            f"training object, so the file was left as it is. Build `{late[0]}` before the first training loop or "
            "call, and run again"), unconverted=True)]
        return
    captured = _drawn_before(roles, home, point)
    if captured is not None:
        binding, loader = captured
        roles.refused = True
        roles.findings = [Finding(PREPARE, binding.where.stmt, (
            f"`{binding.name}` takes its batches from `{loader}` here, before `accelerator.prepare(...)`, which can "
            "only run once the model and the optimizer are built, further down: it would keep drawing from the "
            f"unprepared `{loader}` (every process all of the data, none of it on the device), whatever the "
            f"prepare call rebinds `{loader}` to. The file was left as it is: move this line below the line "
            "that builds the optimizer (before the training loop), and run again"), unconverted=True)]
        return
    roles.prepare_after = point
    roles.prepare_per_iteration = per_iteration
    roles.prepare_repeated = (
        per_iteration is None and roles.accelerator_scope is not home and roles.called_in_loop(home)
        and all(_setup_bindings(home, n, first_use) for n in names)
    )
    _find_wrapped_aliases(roles)
    if not _find_step_aliases(roles, names, first_use):
        return
    if per_iteration is None:
        _early_prepare(roles, home, names, first_use, creation)


def _loops_of(ref: StmtRef) -> list[StmtRef]:
    """The loops enclosing `ref`, outermost first."""
    return [p for p in ref.path if type(p.stmt) in (cst.For, cst.While)]


def _within(ref: StmtRef, loop: StmtRef) -> bool:
    return any(p.stmt is loop.stmt for p in ref.path)


def _iteration_loop(roles: Roles, home: Scope, names: list[str], setup: list[StmtRef]) -> tuple[StmtRef, int] | Finding:
    """A training object built inside a loop: the loop whose every iteration builds all the objects
    `prepare` takes and then trains them (`for fold in range(K):` building the fold's loaders, model
    and optimizer, then its epochs), with the document order of its first training statement. The
    prepare call then goes inside that loop after the last of them, as HF Accelerate does for
    repeated runs (`accelerator.free_memory()` before it drops the previous iteration's objects).
    Else the AM004 finding that says why one prepare call cannot be placed: some objects are built
    once outside the loop while others are rebuilt in it, the loop does not train what it builds,
    or the objects are built in different loops."""
    nested = [r for r in setup if r.in_loop]
    chains = [_loops_of(r) for r in nested]
    common: StmtRef | None = None
    for depth in range(min((len(c) for c in chains), default=0)):
        if len({id(c[depth].stmt) for c in chains}) != 1:
            break
        common = chains[0][depth]
    stmt = nested[0].stmt
    if common is None or any(c[-1].stmt is not common.stmt for c in chains):
        return Finding(PREPARE, stmt, (
            "training objects are created in different loops (or one loop inside another), so no single place "
            "runs after all of them and before training; `accelerator.prepare(...)` was not inserted: build them "
            "in one block (once, or once per iteration of one loop) and run again, or prepare them yourself "
            "after they are built"), unconverted=True)
    loop = common
    line = _loop_header(loop)
    orders = [l.where.order for l in home.loops if roles.is_training_loop(l) and _within(l.where, loop)]
    orders += [site.where.order for site in home.calls if roles.calls_training(site, home) and _within(site.where, loop)]
    if not orders:
        return Finding(PREPARE, stmt, (
            f"a training object is created inside the loop `{line}`, which does not train it (training runs "
            "after the loop), so `accelerator.prepare(...)` was not inserted: it must run after the objects "
            "the training step uses are built, and before that step. Prepare them yourself right after the "
            f"loop: `{', '.join(names)} = accelerator.prepare({', '.join(names)})`"),
            unconverted=True)
    first_use = min(orders)
    ancestors = {id(p.stmt) for p in (*loop.path, loop)}
    outside = [l.where.stmt for l in home.loops if roles.is_training_loop(l)
               and id(l.node) not in ancestors and not _within(l.where, loop)]
    outside += [site.where.stmt for site in home.calls if roles.calls_training(site, home) and not _within(site.where, loop)]
    if outside:
        return Finding(PREPARE, outside[0], (
            f"the training objects are built anew in every iteration of `{line}` and trained there, and this "
            "training outside that loop runs too (a final run on all the data, say); one placement of "
            "`accelerator.prepare(...)` cannot serve both, so it was not inserted: prepare the objects in the "
            "loop right after they are built and again before this training, after the objects it uses are "
            "built (`accelerator.free_memory()` before each prepare call lets go of the previous ones)"),
            unconverted=True)
    inside = {n: [b.where for b in home.bindings.get(n, []) if not b.is_loop_target and _within(b.where, loop)
                  and b.where.order < first_use] for n in names}
    models = [m for m in roles.models if m in names]
    wrapped = [b.where.order for m in models for b in home.bindings.get(m, [])
               if _wraps(roles, b.value) and _within(b.where, loop)]
    loads = [site for site in home.method_calls
             if type(site.receiver) is cst.Name and site.receiver.value in models
             and type(site.call.func) is cst.Attribute and site.call.func.attr.value == "load_state_dict"
             and _within(site.where, loop) and min(wrapped, default=first_use) < site.where.order < first_use]
    if loads:
        model = loads[0].receiver.value  # type: ignore[attr-defined]
        return Finding(PREPARE, loads[0].where.stmt, (
            f"`{model}.load_state_dict(...)` loads state into `{model}` after its hand wrap "
            f"(`DataParallel`/`DistributedDataParallel`) in every iteration of `{line}`; migrated, the wrap goes and "
            "`accelerator.prepare(...)` comes after the last object the iteration builds, so the load would run "
            "on the bare module, which refuses the `module.`-prefixed keys of a checkpoint written from the wrapped "
            f"model. Nothing was prepared: load the state before the wrap, into the bare module, with the prefix "
            f"stripped (`{model}.load_state_dict({{k.removeprefix('module.'): v for k, v in state.items()}})`), "
            "and run again"),
            unconverted=True)
    once = [n for n in names if not inside[n]]
    if once:
        rebuilt = [n for n in names if inside[n]]
        shown = ", ".join(f"`{n}`" for n in once)
        again = ", ".join(f"`{n}`" for n in rebuilt)
        return Finding(PREPARE, inside[rebuilt[0]][0].stmt, (
            f"{again} {'is' if len(rebuilt) == 1 else 'are'} built anew in every iteration of `{line}`, while "
            f"{shown} {'is' if len(once) == 1 else 'are'} built once, outside it; one `accelerator.prepare(...)` "
            "call takes them all after the last is built, and no place in the file comes after all of them and "
            "before training in every iteration, so it was not inserted. Prepare them in two calls: "
            f"`{', '.join(once)} = accelerator.prepare({', '.join(once)})` once, before the loop, and "
            f"`{', '.join(rebuilt)} = accelerator.prepare({', '.join(rebuilt)})` in the loop, right after "
            f"{again} {'is' if len(rebuilt) == 1 else 'are'} built"), unconverted=True)
    return loop, first_use


def _loop_header(loop: StmtRef) -> str:
    """`for fold in range(K):` (the loop's first line, shortened)."""
    node = loop.stmt
    empty = cst.Module([])
    if isinstance(node, cst.For):
        text = f"for {empty.code_for_node(node.target)} in {empty.code_for_node(node.iter)}:"
    else:
        assert isinstance(node, cst.While)
        text = f"while {empty.code_for_node(node.test)}:"
    return text if len(text) <= 60 else text[:57] + "..."


def _drawn_before(roles: Roles, home: Scope, point: StmtRef) -> tuple[Binding, str] | None:
    """A training loader handed to `iter(...)` or to a generator of the module that draws from it
    (`batches = cycle(loader)`), bound before the prepare point: the iterator holds the loader
    object as it was, so rebinding the name by `prepare` does not reach it."""
    for bindings in home.bindings.values():
        for binding in bindings:
            value = binding.value
            if binding.where.order >= point.order or not draws_through(roles, value):
                continue
            assert isinstance(value, cst.Call)
            arg = value.args[0].value
            if isinstance(arg, cst.Name) and arg.value in roles.loaders:
                return binding, arg.value
    return None


def _early_prepare(roles: Roles, home: Scope, names: list[str], first_use: int, creation: StmtRef | None) -> None:
    """A model the script wraps by hand (`model = DDP(model)`, removed by AM007) and then loads
    state into before the prepare point (`model.load_state_dict(ckpt["model"])` in a resume block
    between the optimizer and the loaders): the checkpoint the original script wrote holds DDP's
    `module.` keys, which the bare module refuses. The models, with the optimizers already built,
    are prepared in a call of their own right before the statement that holds that first load
    (the runtime's prepared model takes the user's keys and `module.` ones, and optimizer state
    loaded after it lands on the parameters' device); the loaders and the rest keep the prepare
    point after them. Not when a model is bound after the load, nor when the statement holding
    the load is not in the block where the models and optimizers are all bound."""
    point = roles.prepare_after
    assert point is not None
    models = [n for n in roles.models if n in names]
    if not models:
        return
    wraps = [b.where.order for m in models for b in home.bindings.get(m, []) if _wraps(roles, b.value)]
    if not wraps:
        return
    wrapped_at = min(wraps)
    loads = [site for site in home.method_calls
             if type(site.receiver) is cst.Name and type(site.call.func) is cst.Attribute
             and site.call.func.attr.value == "load_state_dict"
             and site.receiver.value in (*models, *roles.optimizers)
             and wrapped_at < site.where.order < min(point.order, first_use) and not site.loops]
    if not any(site.receiver.value in models for site in loads):  # type: ignore[attr-defined]
        return
    load = min(loads, key=lambda site: site.where.order).where
    early: list[str] = []
    refs: list[StmtRef] = []
    for name in (*models, *(o for o in roles.optimizers if o in names)):
        bound = [r for r in _setup_bindings(home, name, first_use) if r.order < load.order]
        if not bound:
            if name in models:
                return  # a model bound after the load: it cannot be prepared before it
            continue  # an optimizer built after the load: prepared with the loaders
        if any(r.order > load.order for r in _setup_bindings(home, name, first_use)):
            return  # rebound after the load: the early call would prepare a stale object
        early.append(name)
        refs.extend(bound)
    refs += [m for m in _model_moves(roles, home, first_use) if m.order < load.order]
    after = _common_insertion_point(refs)
    if creation is not None and creation.order > after.order:
        return
    holder = next((ref for ref in (*load.path, load) if ref.block is after.block), None)
    if holder is None or holder.order <= after.order or holder.stmt is point.stmt:
        return
    roles.early_prepare = (holder, early)
    roles.early_load = next(site.call for site in loads if site.receiver.value in models)  # type: ignore[attr-defined]


def _find_wrapped_aliases(roles: Roles) -> None:
    """`self.ddp_model = DDP(self.model, ...)` (and `self.ddp_model = self.model` when it does not
    wrap), after the prepare point: the trainer trains the alias and saves the bare model, so
    `prepare` binds the alias and the bindings go (`roles.model_aliases`, `alias_removal`)."""
    home, after = roles.home, roles.prepare_after
    assert home is not None and after is not None
    for name, bindings in home.bindings.items():
        if name in roles.models or not bindings:
            continue
        models = {_alias_of(roles, b.value) for b in bindings}
        if len(models) != 1 or None in models or not any(_wraps(roles, b.value) for b in bindings):
            continue
        model = models.pop()
        if model in roles.models and all(
            (b.where.order > after.order or _unread_until_prepare(roles, home, name, b.where, after))
            and alias_removal(b.where, home.bindings[name]) is not None for b in bindings
        ):
            roles.model_aliases[name] = model  # type: ignore[index]


def _find_step_aliases(roles: Roles, names: list[str], first_use: int) -> bool:
    """A plain alias of a prepared object bound before the prepare point that the training step
    uses (`net = model` ... `net(x)`; see `migrate.roles.step_aliases`): prepare binds it again
    (`roles.step_aliases`). False, with the file refused on the alias line, when the alias is handed
    on before the prepare point, where rebinding it cannot reach what holds it."""
    home, after = roles.home, roles.prepare_after
    assert home is not None and after is not None
    prepared = set(names)
    methods = [m for m in roles.methods_of(home) or [] if m is not home]
    for alias, bindings in home.bindings.items():
        if alias in prepared or alias in roles.model_aliases or not bindings:
            continue
        origins = {step_aliases.origin(home, b) for b in bindings}
        if len(origins) != 1 or None in origins or not origins <= prepared:
            continue
        (target,) = origins
        if any(b.is_loop_target or b.where.order > after.order for b in bindings):
            continue
        steps = [loop.node for loop in home.loops if roles.is_training_loop(loop)]
        steps += [site.call for site in home.calls if roles.calls_training(site, home)
                  and any(step_aliases.handed_on([arg.value], home, alias) is not None for arg in site.call.args)]
        steps += [m.node for m in methods]
        if not any(s is not None and (step_aliases.used_by_step(s, home, alias) or isinstance(s, cst.Call))
                   for s in steps):
            continue
        where = bindings[-1].where
        stmts = step_aliases.between(home, where, after)
        held = step_aliases.handed_on(stmts, home, alias) if stmts is not None else where.stmt
        if stmts is None or held is not None or len(bindings) != 1:
            roles.refused = True
            roles.findings = [Finding(PREPARE, bindings[0].where.stmt, (
                f"`{alias}` names `{target}` here, before `accelerator.prepare(...)`, and the training step uses "
                f"`{alias}`; prepare rebinds `{target}` only, and `{alias}` is handed on before the prepare point, "
                f"so whatever holds it would keep the unprepared object (no gradient sync across processes). The "
                f"file was left as it is: write `{target}` wherever `{alias}` is used, drop this line, and run again"
            ), unconverted=True)]
            return False
        roles.step_aliases[alias] = target
    return True


def _unread_until_prepare(roles: Roles, home: Scope, name: str, where: StmtRef, after: StmtRef) -> bool:
    """An alias bound before the prepare point (`self.ddp_model = DDP(self.model)` written before
    the loader is built): prepare binds it in place of that binding when nothing between the two
    reads it, neither a statement of home (the statements after the binding's, up to the prepare
    point, in home's own block) nor a method it calls there (`self.m(...)` or `self` handed on) or a
    function of the file (which may read a module-level alias).
    The order the setup is written in then makes no difference."""
    body = home.node.body if isinstance(home.node, cst.Module) else getattr(getattr(home.node, "body", None), "body", None)
    if not isinstance(body, (list, tuple)):
        return False
    top = [ref.stmt for ref in (*where.path, where)][0]
    last = [ref.stmt for ref in (*after.path, after)][0]
    ids = [id(stmt) for stmt in body]
    if id(top) not in ids or id(last) not in ids or ids.index(id(top)) >= ids.index(id(last)):
        return False
    owner = home.params[0] if home.is_method and home.params else None
    functions = set(roles.facts.functions)
    return not any(_reads(stmt, name, owner, functions) for stmt in body[ids.index(id(top)) + 1 : ids.index(id(last)) + 1])


def _reads(stmt: cst.CSTNode, name: str, owner: str | None, functions: set[str]) -> bool:
    """`stmt` mentions `name` (`ddp_model` or `self.ddp_model`), or calls a method of `owner` /
    hands `owner` itself to a call (which may read the alias)."""
    found = False

    class _Visitor(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            nonlocal found
            if instance_attribute(node) == name:
                found = True
            return True

        def visit_Name(self, node: cst.Name) -> bool:
            nonlocal found
            if node.value == name:
                found = True
            return True

        def visit_Call(self, node: cst.Call) -> bool:
            nonlocal found
            func = node.func
            if owner is not None and isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) \
                    and func.value.value == owner:
                found = True
            if owner is not None and any(isinstance(a.value, cst.Name) and a.value.value == owner for a in node.args):
                found = True
            if isinstance(func, cst.Name) and func.value in functions:
                found = True
            return True

    stmt.visit(_Visitor())
    return found


def alias_removal(where: StmtRef, bindings: list[Binding]) -> cst.BaseStatement | None:
    """What goes with one binding of a model alias so that valid code remains: its statement when
    its block keeps others, or the whole `if cuda: alias = DDP(model) else: alias = model` when
    every branch only binds the alias; None when neither fits."""
    stmt = where.stmt
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    if len(getattr(where.block, "body", ())) > 1:
        return stmt
    parent = where.path[-1].stmt if where.path else None
    if not isinstance(parent, cst.If):
        return None
    alias_statements = {id(b.where.stmt) for b in bindings}
    branch: cst.If | cst.Else | None = parent
    while branch is not None:
        body = branch.body
        if not (isinstance(body, cst.IndentedBlock) and all(id(s) in alias_statements for s in body.body)):
            return None
        branch = branch.orelse if isinstance(branch, cst.If) else None
    return parent


def _wraps(roles: Roles, value: cst.BaseExpression | None) -> bool:
    return isinstance(value, cst.Call) and bool(value.args) and roles.facts.aliases.qualify(value.func) in HAND_WRAPPERS


def _alias_of(roles: Roles, value: cst.BaseExpression | None) -> str | None:
    """The model `value` is (`self.model`) or wraps by hand (`DDP(self.model, ...)`)."""
    if value is not None and _wraps(roles, value):
        assert isinstance(value, cst.Call)
        value = value.args[0].value
    if isinstance(value, cst.Name):
        return value.value
    return instance_attribute(value) if value is not None else None


def _setup_bindings(home: Scope, name: str, first_use: int, loop: StmtRef | None = None) -> list[StmtRef]:
    """Where `name` is bound for training: the bindings before the first training use when there are
    some. A model rebuilt after training (`model = Net()` + `load_state_dict` to run inference, as
    tutorials do) is not what trains: preparing after the rebuild would leave training unprepared.
    With `loop` (objects built anew in each of its iterations), its own bindings in that loop only."""
    refs = [b.where for b in home.bindings.get(name, []) if not b.is_loop_target
            and (loop is None or _within(b.where, loop))]
    # Own document order, not the top-level statement's: a binding and the loop it feeds may share
    # one enclosing block (`if True:` / `with ...:`), which would make every binding "not before".
    before = [r for r in refs if r.order < first_use]
    return before or refs


def _model_moves(roles: Roles, home: Scope, first_use: int, loop: StmtRef | None = None) -> list[StmtRef]:
    """Home's own moves of a model to the chosen device after it is built and before training
    (`self.G.to(self.device)` after the optimizers are built): `prepare` goes after them, so AM002
    drops them as moves the Accelerator makes. Kept after `prepare`, a move of a prepared model is
    at best a no-op, and under DDP a model moved after its reducer was built fails on backward."""
    found: list[StmtRef] = []
    for move in home.moves:
        receiver = move.receiver
        ref = receiver.value if isinstance(receiver, cst.Name) else instance_attribute(receiver)
        in_loop = move.where.in_loop if loop is None else [p.stmt for p in _loops_of(move.where)][-1:] != [loop.stmt]
        if ref is None or ref not in roles.models or in_loop or move.where.order > first_use:
            continue
        if move.device_arg is not None and not roles.is_device(home, move.device_arg):
            continue
        stmt = move.where.stmt
        if is_expression_statement(stmt, move.call):
            found.append(move.where)
    return found


def _first_training_use(roles: Roles) -> int:
    """Document order of home's first statement that trains (a training loop or a call into one)."""
    home = roles.home
    assert home is not None
    orders = [loop.where.order for loop in home.loops if roles.is_training_loop(loop)]
    orders += [site.where.order for site in home.calls if roles.calls_training(site, home)]
    return min(orders, default=1 << 60)


def _common_insertion_point(refs: list[StmtRef]) -> StmtRef:
    """The statement after which every ref has been executed, in the deepest shared block."""
    chains = [(*r.path, r) for r in refs]
    depth = 0
    while all(len(c) > depth + 1 for c in chains) and len({id(c[depth]) for c in chains}) == 1:
        depth += 1
    candidates = [c[min(depth, len(c) - 1)] for c in chains]
    if len({id(c.block) for c in candidates}) > 1 and depth > 0:
        candidates = [c[depth - 1] for c in chains]
    return max(candidates, key=lambda r: r.order)


def creation_can_follow(roles: Roles, stmt: cst.BaseStatement) -> bool:
    """The Accelerator, which replaces the module-level device choice, can be created right after
    `stmt` instead (a top-level statement of the module below the choice: `accum = 4` that
    `Accelerator(gradient_accumulation_steps=accum)` reads), with `device = accelerator.device`
    after it: the choice is one statement of its own at the top level of the module, and every
    statement after it up to `stmt` only binds names from values that call nothing and do not read
    the device (`batch_size = 32`, `lr = 3e-4 * 2`), so none of them needs the Accelerator or the
    device, and none runs anything that could."""
    binding = roles.device_binding
    module = roles.facts.module_scope
    if roles.accelerator_scope is not module or roles.device_from_setup:
        return False
    body = list(module.node.body) if isinstance(module.node, cst.Module) else []
    ids = [id(s) for s in body]
    if binding is None:
        # no device choice: created before the module's first statement after the imports, which
        # must itself only bind names (`accum = 4` right below the imports)
        first = roles.create_before
        if first is None or id(first) not in ids or id(stmt) not in ids or ids.index(id(stmt)) < ids.index(id(first)):
            return False
        start, device = ids.index(id(first)), ""
    else:
        choice = binding.where.stmt
        if binding.where.path or not (type(choice) is cst.SimpleStatementLine and len(choice.body) == 1):
            return False
        if id(choice) not in ids or id(stmt) not in ids or ids.index(id(stmt)) <= ids.index(id(choice)):
            return False
        start, device = ids.index(id(choice)) + 1, binding.name
    for between in body[start : ids.index(id(stmt)) + 1]:
        if type(between) is not cst.SimpleStatementLine:
            return False
        for small in between.body:
            if type(small) not in (cst.Assign, cst.AnnAssign) or small.value is None:
                return False
            if not _plain_value(small.value, device):
                return False
    return True


def _plain_value(value: cst.BaseExpression, device: str) -> bool:
    """`value` calls nothing, builds no lambda or comprehension, and does not read `device`."""
    plain = True

    class _Visitor(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            nonlocal plain
            plain = False
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            nonlocal plain
            plain = False
            return False

        def visit_Name(self, node: cst.Name) -> bool:
            nonlocal plain
            if node.value in (device, "accelerator"):
                plain = False
            return False

        def visit_Attribute(self, node: cst.Attribute) -> bool:
            nonlocal plain
            plain = False  # a property may run code
            return False

        def visit_Subscript(self, node: cst.Subscript) -> bool:
            nonlocal plain
            plain = False  # __getitem__ may run code
            return False

    value.visit(_Visitor())
    return plain
